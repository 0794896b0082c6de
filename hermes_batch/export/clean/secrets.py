"""Keys and tokens in text (`--scrub=secrets`): detect-secrets' detectors of known shapes (AWS,
GitHub, GitLab, Slack, Stripe, OpenAI, Twilio, SendGrid, npm, PyPI, Discord, Telegram, Azure, IBM,
Artifactory, Mailchimp, Square, Softlayer, Cloudant keys; JSON Web Tokens; `password = "..."` and
its kin; user:password@ in URLs), whole private-key blocks, and tokens in URL parameters. Its
high-entropy detectors are left out: agent output is full of hashes and ids they would mask.

detect-secrets scans line by line and names a value by the part its pattern captured (a GitHub
token by its `ghp` prefix): each value is widened to the whole run of key characters around it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

LEFT_OUT = ("Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector")  # hashes, ids; IPs are pii's
PEM = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
                 re.S)
URL_TOKEN = re.compile(r"(?i)[?&](?:api[_-]?key|apikey|key|token|access[_-]?token|auth|secret|client[_-]?secret|password"
                       r"|passwd|sig|signature)=([^&\s\"'#<>\\]{8,})")
# a line worth detect-secrets' time (it costs ~0.25 ms a line): a keyword, a long run of key characters, a URL's user
SUSPECT = re.compile(r"(?i)pass|secret|token|key|auth|cred|priv|bearer|[A-Za-z0-9_+/=-]{20,}|://[^/\s@]+@")
KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./+")
SHORTEST = 8  # shorter captures (a keyword's "x") are no key worth masking
KINDS = {"AWS Access Key": "aws_key", "GitHub Token": "github_token", "GitLab Token": "gitlab_token",
         "Slack Token": "slack_token", "Stripe Access Key": "stripe_key", "OpenAI Token": "openai_key",
         "JSON Web Token": "jwt", "Secret Keyword": "password", "Basic Auth Credentials": "url_password",
         "Twilio API Key": "twilio_key", "SendGrid API Key": "sendgrid_key", "NPM tokens": "npm_token",
         "PyPI Token": "pypi_token", "Discord Bot Token": "discord_token", "Telegram Bot Token": "telegram_token"}


def _slug(kind: str) -> str:
    return KINDS.get(kind) or re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_")


class SecretFinder:
    """detect-secrets with the detectors of known shapes, set up once for the export."""

    def __init__(self) -> None:
        try:
            from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
            from detect_secrets.core.scan import scan_line
            from detect_secrets.settings import transient_settings
        except ImportError as exc:
            from ...errors import ExportError

            raise ExportError("--scrub=secrets finds keys with detect-secrets: pip install -e '.[export]'") from exc
        plugins: list[Any] = list(get_mapping_from_secret_type_to_class().values())
        names = [c.__name__ for c in plugins if c.__name__ not in LEFT_OUT]
        self._settings: Any = transient_settings({"plugins_used": [{"name": n} for n in sorted(names)]})
        self._settings.__enter__()  # detect-secrets keeps its settings globally; held for the export's life
        self._scan = scan_line

    def close(self) -> None:
        self._settings.__exit__(None, None, None)

    def find(self, text: str) -> Iterator[tuple[str, str]]:
        """(value, kind) of each secret in `text`."""
        for m in PEM.finditer(text):
            yield m.group(), "private_key"
        for m in URL_TOKEN.finditer(text):
            yield m.group(1), "url_token"
        if not SUSPECT.search(text):
            return
        for line in text.split("\n"):
            if len(line) < SHORTEST or not SUSPECT.search(line):
                continue
            for found in self._scan(line):
                kind = _slug(found.type)
                if kind == "private_key":  # its header line only: the block is PEM's above
                    continue
                value = _widened(line, found.secret_value or "")
                if len(value) >= SHORTEST:
                    yield value, kind


def _widened(line: str, value: str) -> str:
    """The whole run of key characters around `value` in `line` (a `=` only as padding at its end)."""
    at = line.find(value)
    if at < 0 or not value:
        return value
    start, end = at, at + len(value)
    while start > 0 and line[start - 1] in KEY_CHARS:
        start -= 1
    while end < len(line) and line[end] in KEY_CHARS:
        end += 1
    while end < len(line) and line[end] == "=":
        end += 1
    return line[start:end].rstrip(".")
