"""`--format=sharegpt`: the records as the run wrote them (Hermes format), filtered; for Parquet and
datasets, their free-form parts as JSON text. With --max_tokens, a record over the budget has its
middle turns replaced by one summary (compress.py), as the reference's compressor does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..record import prompt_id_of, sample_number, samples_of
from .compress import compressed_record
from .files import write_rows
from .rows import Rows


def columns(rec: dict[str, Any]) -> dict[str, Any]:
    """A record with its free-form parts as JSON text, for one Arrow schema."""
    return {"id": rec["id"], "prompt_index": rec.get("prompt_index"), "prompt_id": prompt_id_of(rec),
            "sample": sample_number(rec), "samples": samples_of(rec),
            "conversations": rec.get("conversations") or [],
            "completed": bool(rec.get("completed")), "partial": bool(rec.get("partial")),
            "api_calls": int(rec.get("api_calls") or 0), "toolsets_used": rec.get("toolsets_used") or [],
            "tool_stats": json.dumps(rec.get("tool_stats") or {}), "tool_error_counts": json.dumps(rec.get("tool_error_counts") or {}),
            "metadata": json.dumps(rec.get("metadata") or {}, ensure_ascii=False),
            "verification": json.dumps(rec.get("verification"), ensure_ascii=False)}


def write(rows: Rows, output: Path) -> None:
    as_written = output.suffix.lower() == ".jsonl"
    records = (compressed_record(rec, row) for rec, row in rows)
    write_rows(output, (rec if as_written else columns(rec) for rec in records), schema)


def schema() -> Any:
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
    result = pa.struct([("tool_call_id", pa.string()), ("name", pa.string()), ("content", pa.string())])
    turn = pa.struct([("from", pa.string()), ("value", pa.string()), ("content", pa.string()),
                      ("reasoning", pa.string()), ("tool_calls", pa.list_(call)), ("name", pa.string()),
                      ("tool_call_id", pa.string()), ("reasoning_details", pa.string()),
                      ("tool_results", pa.list_(result))])
    return pa.schema([("id", pa.string()), ("prompt_index", pa.int64()), ("prompt_id", pa.string()),
                      ("sample", pa.int64()), ("samples", pa.int64()), ("conversations", pa.list_(turn)),
                      ("completed", pa.bool_()), ("partial", pa.bool_()), ("api_calls", pa.int64()),
                      ("toolsets_used", pa.list_(pa.string())), ("tool_stats", pa.string()),
                      ("tool_error_counts", pa.string()), ("metadata", pa.string()), ("verification", pa.string())])
