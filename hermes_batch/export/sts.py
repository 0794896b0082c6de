"""`--format=sts`: the Hugging Face Hub's Session Trace Simple format, one JSONL file per trajectory
(a session header, then one line per message), for the Hub's trace viewer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .files import write_lines
from .options import verdict_of
from .rows import Rows

HARNESS = "hermes-batch"


def sts_lines(rec: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    """`row` is the record's openai_row (already made to check it)."""
    meta = rec.get("metadata") or {}
    first_user = next((t.get("value") for t in rec.get("conversations") or [] if t.get("from") == "human"), "")
    lines: list[dict[str, Any]] = [{"type": "session", "harness": HARNESS, "id": rec["id"],
                                    "name": (first_user or rec["id"])[:120], "model": meta.get("model"),
                                    "completed": rec.get("completed"), "stop_reason": meta.get("stop_reason"),
                                    "verification": verdict_of(rec)}]
    if meta.get("cleaning"):  # said only when cleaning did something to it
        lines[0]["cleaning"] = meta["cleaning"]
    stamp = meta.get("timestamp")
    for m in row["messages"]:
        message: dict[str, Any] = {"role": m["role"], "content": m["content"], "timestamp": stamp}
        if m["reasoning_content"]:
            message["reasoningContent"] = m["reasoning_content"]
        if m["tool_calls"]:
            message["toolCalls"] = [{"id": c["id"], "function": c["function"]} for c in m["tool_calls"]]
        if m["tool_call_id"]:
            message["toolCallId"] = m["tool_call_id"]
        if m["role"] == "assistant":
            message["model"] = meta.get("model")
        lines.append({"type": "message", "message": message})
    return lines


def write(rows: Rows, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    for rec, row in rows.named():
        write_lines(output / f"{rec['id']}.jsonl", sts_lines(rec, row))
