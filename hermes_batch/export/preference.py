"""`--format=preference`: one row per pair of a passing and a failing sample of one prompt (--samples):
TRL's conversational preference rows, `prompt` (the user's message), `chosen` and `rejected` (what
each sample's agent did), `tools`, `id` and `metadata`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..record import prompt_id_of
from .curate import paired
from .files import write_rows
from .rows import Rows, metadata, openai_row


def preference_row(chosen: dict[str, Any], good: dict[str, Any], rejected: dict[str, Any],
                   bad: dict[str, Any]) -> dict[str, Any] | None:
    """TRL's conversational preference row from two samples' openai rows; None when they were not
    asked the same (the prompt is what precedes the first reply)."""
    cut = next((i + 1 for i, m in enumerate(good["messages"]) if m["role"] == "user"), 0)
    prompt = good["messages"][:cut]
    if not prompt or bad["messages"][:cut] != prompt or good["tools"] != bad["tools"]:
        return None
    return {"id": f"{chosen['id']}>{rejected['id']}", "prompt": prompt, "chosen": good["messages"][cut:],
            "rejected": bad["messages"][cut:], "tools": good["tools"],
            "metadata": json.dumps({"prompt_id": prompt_id_of(chosen),
                                    "chosen": {"id": chosen["id"], **metadata(chosen)},
                                    "rejected": {"id": rejected["id"], **metadata(rejected)}}, ensure_ascii=False)}


def pair_rows(rows: Rows) -> Iterator[dict[str, Any]]:
    """Each preference pair whose two halves are checked rows of one prompt."""
    selection = rows.selection
    for chosen, rejected in paired(rows.records(), selection.pairs if selection else []):
        chosen, rejected = rows.cleaner.cleaned(chosen), rows.cleaner.cleaned(rejected)
        good, bad = openai_row(chosen), openai_row(rejected)
        pair_id = f"{chosen['id']}>{rejected['id']}"
        if rows.invalid(pair_id, [f"{which}: {p}" for which, row in (("chosen", good), ("rejected", bad))
                                  for p in rows.checker.problems(row)]):
            continue
        row = preference_row(chosen, good, rejected, bad)
        if row is None:
            rows.invalid(pair_id, ["the two samples were not given the same prompt and tools"])
            continue
        rows.report.written += 1
        rows.report.sources.add(chosen, f"{pair_id}:chosen")
        rows.report.sources.add(rejected, f"{pair_id}:rejected")
        yield row


def write(rows: Rows, output: Path) -> None:
    write_rows(output, pair_rows(rows), schema)


def schema() -> Any:
    import pyarrow as pa

    from .openai import message_type

    return pa.schema([("id", pa.string()), ("prompt", message_type()), ("chosen", message_type()),
                      ("rejected", message_type()), ("tools", pa.string()), ("metadata", pa.string())])
