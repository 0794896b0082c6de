"""Personal data in text (`--scrub=pii`), found offline: e-mail addresses (a pattern), phone numbers
(Google's libphonenumber, through `phonenumbers`: numbers valid for their country and grouped as
its numbers are, national ones read as --phone_region's), public IP addresses (the standard library's `ipaddress`: loopback,
private and documentation ranges are no one's), and payment card numbers (13 to 19 digits that
pass the Luhn check).

Names and street addresses are not found: the recognisers that find them offline are models
(presidio's names and places come from a spaCy model published outside PyPI; GLiNER's from a
model hub), which an export that runs offline from PyPI alone cannot load."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

EMAIL = re.compile(r"(?<![\w.+%-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                   r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}(?![\w-])")
# stretches that may hold a phone number: phonenumbers reads only these (it costs ~40 ms on 6 kB of text)
PHONE_LIKE = re.compile(r"(?:\+|\(|\b)\d[\d \t().-]{5,18}\d\b")
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
CARD = re.compile(r"(?<![\d-])[3-6]\d{3}(?:[ -]?\d{3,4}){2,4}\d{0,3}(?![\d-])")


class PersonalFinder:
    def __init__(self, region: str = "US"):
        try:
            import phonenumbers
        except ImportError as exc:
            from ...errors import ExportError

            raise ExportError("--scrub=pii reads phone numbers with phonenumbers: pip install -e '.[export]'") from exc
        self._phones, self._region = phonenumbers, region.upper()

    def find(self, text: str) -> Iterator[tuple[str, str]]:
        """(value, kind) of each piece of personal data in `text`: email, phone, ip, card."""
        if "@" in text:
            for m in EMAIL.finditer(text):
                yield m.group(), "email"
        for m in IPV4.finditer(text):
            if _public(m.group()):
                yield m.group(), "ip"
        if "::" in text or text.count(":") >= 7:
            for m in IPV6.finditer(text):
                if _public(m.group()):
                    yield m.group(), "ip"
        for m in CARD.finditer(text):
            if _luhn(re.sub(r"\D", "", m.group())):
                yield m.group(), "card"
        for m in PHONE_LIKE.finditer(text):
            matcher = self._phones.PhoneNumberMatcher(m.group(), self._region, leniency=self._phones.Leniency.STRICT_GROUPING)
            for found in matcher:
                yield found.raw_string, "phone"


def _public(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_global
    except ValueError:
        return False


def _luhn(digits: str) -> bool:
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, d in enumerate(int(c) for c in reversed(digits)):
        total += d if i % 2 == 0 else (2 * d - 9 if d > 4 else 2 * d)
    return total % 10 == 0
