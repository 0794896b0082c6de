"""Replies that write a tool's result themselves: a `<tool_response>` block (the frame tool results
come back in, here and in the Hermes Agent's records) in an assistant's text that no tool of the
trajectory returned. Trained on, such a reply teaches a model to invent what its tools said; the
record counts them (`metadata.fabricated_tool_results`), statistics add them up, and training
exports leave such rows out unless asked to keep them (--keep_fabricated).

A block that quotes a real result (the same text, or the frame's JSON naming a real call with its
content) is no fabrication. Reasoning is not looked at: only what the reply says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from .conversation import tool_results
from .transcript import visible_text

_BLOCK = re.compile(r"<tool_response>(.*?)(?:</tool_response>|$)", re.S | re.I)


def fabricated_blocks(reply: str, results: dict[str, str]) -> int:
    """How many `<tool_response>` blocks of `reply` no tool returned (`results`: content by call id)."""
    returned = {text.strip() for text in results.values()}
    count = 0
    for m in _BLOCK.finditer(visible_text(reply or "")):
        body = m.group(1).strip()
        if body in returned:
            continue
        try:
            framed = json.loads(body)
        except ValueError:
            framed = None
        if isinstance(framed, dict) and framed.get("tool_call_id") in results:
            content = framed.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            real = results[framed["tool_call_id"]]
            if text.strip() == real.strip() or _same_json(content, real):
                continue
        count += 1
    return count


def fabricated_replies(replies: Iterable[str], results: dict[str, str]) -> int:
    """How many of `replies` hold at least one fabricated tool result."""
    return sum(1 for reply in replies if fabricated_blocks(reply, results))


def fabricated_in_record(rec: dict[str, Any]) -> int:
    """The record's count: as it was written (format 4 on), else read from its turns."""
    meta = rec.get("metadata") or {}
    if isinstance(meta.get("fabricated_tool_results"), int):
        return meta["fabricated_tool_results"]
    turns = rec.get("conversations") or []
    results = {str(r.get("tool_call_id")): r.get("content") or "" for t in turns if t.get("from") == "tool"
               for r in tool_results(t)}
    replies = [t.get("content") if "content" in t else t.get("value") for t in turns if t.get("from") == "gpt"]
    return fabricated_replies((r or "" for r in replies), results)


def _same_json(value: Any, text: str) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
