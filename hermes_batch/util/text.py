"""Text cut to a size for a record, a log or a model's context."""

from __future__ import annotations


def head_part(limit: int) -> int:
    """Of `limit` kept of a long output, how much its head keeps (the tail, where errors are, the rest)."""
    return limit * 2 // 5


def clip(text: str, limit: int, where: str = "") -> str:
    """Cut text to `limit` characters, keeping 40% head and 60% tail."""
    if len(text) <= limit:
        return text
    head = head_part(limit)
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted{where} ...]\n{text[-tail:]}"
