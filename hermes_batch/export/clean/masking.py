"""Masking a trajectory: every value the finders name (the run's keys always; secrets and personal
data with --scrub) is replaced, in every text the record carries, by a typed placeholder, the same
value by the same placeholder throughout the trajectory so the conversation still reads:

    <SECRET:run_api_key>  <SECRET:aws_key>  <SECRET:aws_key_2>  <EMAIL_1>  <PHONE_2>  <IP_1>  <CARD_1>

A value is found in a message's text and replaced wherever it shows, also where the record writes it
JSON-escaped (a tool turn's Hermes `value`, a call's arguments). Structural fields (ids, roles, tool
names, the token data, image references) are not text and are left as they are."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Finder = Callable[[str], Iterable[tuple[str, str]]]
NOT_TEXT = frozenset({"id", "prompt_id", "tool_call_id", "from", "role", "name", "tokens", "images", "format",
                      "check_version", "config_fingerprint", "sha256", "mime", "type", "finish_reason",
                      "stop_reason", "status", "kind", "run_name", "timestamp", "model", "backend", "distribution",
                      "cleaning"})
PERSONAL = {"email": "EMAIL", "phone": "PHONE", "ip": "IP", "card": "CARD"}


@dataclass
class Masked:
    """What masking did to one trajectory: each value's placeholder and kind (in order of appearance)."""

    placeholders: dict[str, str] = field(default_factory=dict)  # value → placeholder
    kinds: dict[str, str] = field(default_factory=dict)  # value → kind

    def __bool__(self) -> bool:
        return bool(self.placeholders)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind in self.kinds.values():
            out[kind] = out.get(kind, 0) + 1
        return out

    def replacements(self) -> dict[str, str]:
        """Each value, and its JSON-escaped form where that differs, → its placeholder."""
        out = {}
        for value, placeholder in self.placeholders.items():
            out[value] = placeholder
            escaped = json.dumps(value, ensure_ascii=False)[1:-1]
            if escaped != value:
                out[escaped] = placeholder
                out.setdefault(json.dumps(value)[1:-1], placeholder)
        return out


def texts(obj: Any) -> Iterator[str]:
    """Every text the record carries, in order (the structural fields left out)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in NOT_TEXT:
                yield from texts(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from texts(v)


def _canonical(value: str) -> str:
    """A value found JSON-escaped (in a raw `value` field) as its text, so both forms share a placeholder."""
    if "\\" in value:
        try:
            decoded = json.loads(f'"{value}"')
            if isinstance(decoded, str):
                return decoded
        except ValueError:
            pass
    return value


def find(record: dict[str, Any], finders: list[Finder]) -> Masked:
    """The values to mask in `record`, each with its placeholder (finders in priority order)."""
    masked = Masked()
    numbers: dict[str, int] = {}
    for text in texts(record):
        for finder in finders:
            for value, kind in finder(text):
                value = _canonical(value)
                if not value.strip() or value in masked.placeholders:
                    continue
                numbers[kind] = n = numbers.get(kind, 0) + 1
                if kind in PERSONAL:
                    placeholder = f"<{PERSONAL[kind]}_{n}>"
                else:
                    placeholder = f"<SECRET:{kind}>" if n == 1 else f"<SECRET:{kind}_{n}>"
                masked.placeholders[value], masked.kinds[value] = placeholder, kind
    return masked


def replaced(obj: Any, pattern: re.Pattern[str], table: dict[str, str]) -> Any:
    """`obj` with every value in `table` replaced in its texts (the structural fields kept)."""
    if isinstance(obj, str):
        return pattern.sub(lambda m: table[m.group()], obj)
    if isinstance(obj, dict):
        return {k: (v if k in NOT_TEXT else replaced(v, pattern, table)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [replaced(v, pattern, table) for v in obj]
    return obj


def masked_record(record: dict[str, Any], masked: Masked) -> dict[str, Any]:
    table = masked.replacements()
    pattern = re.compile("|".join(re.escape(v) for v in sorted(table, key=len, reverse=True)))
    return replaced(record, pattern, table)


def preview(value: str) -> str:
    """A value as a dry run shows it: enough to recognise, never the whole."""
    value = value.replace("\n", " ")
    return f"{value[:4]}… ({len(value)} characters)" if len(value) > 6 else f"{value[:2]}… ({len(value)} characters)"
