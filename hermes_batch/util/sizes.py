"""Sizes as people write them (`512m`, `2g`)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.I)


def parse_size(text: str | int, what: str = "size") -> int:
    """`512m`, `2g`, `1.5G`, `4096` (bytes) → bytes; a clear error otherwise."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"cannot read {what} {text!r} (write it like 512m or 2g)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))
