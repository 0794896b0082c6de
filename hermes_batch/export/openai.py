"""`--format=openai`: one row per trajectory: `messages` (user / assistant with native `tool_calls` and
a `reasoning_content` field / tool results paired by `tool_call_id`), `tools` (the JSON schemas
offered to that prompt), `id` and `metadata`. Arguments, tool schemas and metadata are JSON strings,
so every row has the same Arrow schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .files import write_rows
from .rows import Rows


def write(rows: Rows, output: Path) -> None:
    write_rows(output, (row for _, row in rows), schema)


def message_type() -> Any:
    """The Arrow type of a list of OpenAI messages (as openai_row makes them)."""
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
                               ("tool_calls", pa.list_(call)), ("tool_call_id", pa.string()), ("name", pa.string())]))


def schema() -> Any:
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("messages", message_type()), ("tools", pa.string()),
                      ("metadata", pa.string())])
