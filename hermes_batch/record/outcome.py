"""The run's record schema in one place: how a settled prompt is told to the single writer
(`Outcome`), the failure entry, the JSON line encoding and the UTC timestamp.

A trajectory record itself is assembled by `build.build_record`, and read back through `version`; a discard is that record
with a `discarded` reason; a failure is a small entry in `failed.jsonl` that keeps what it spent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from .version import FORMAT

OutcomeKind = Literal["done", "discarded", "failed"]
_SURROGATE = re.compile("[\ud800-\udfff]")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def record_timestamp() -> str:
    """A record's `metadata.timestamp`: UTC, to the microsecond, always written with them: Arrow reads
    an ISO time without a fraction as a timestamp, and the Hermes Agent's records hold a string there."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def dumps(record: dict[str, Any]) -> bytes:
    """One JSON line. A lone surrogate (a model can emit "\\ud800") cannot be UTF-8: it becomes U+FFFD."""
    line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
    try:
        return line.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", line).encode()


@dataclass(slots=True)
class Outcome:
    """One prompt settled: what the writer appends (`line`, encoded where it was made so the single
    writer stays cheap) and what the run counts (spend, and why it was discarded or failed)."""

    kind: OutcomeKind
    id: str
    index: int
    line: bytes
    tokens: int = 0
    cost: float | None = None
    reason: str | None = None  # discarded: the filter that dropped it
    error_kind: str | None = None  # failed: e.g. rate_limited, sandbox_error, prompt_timeout
    error: str | None = None
    verdict: str | None = None  # done: its checks' verdict (pass, fail, error, skipped)
    workspace: bytes | None = None  # done, --save_workspace: the agent's final work tree (.tar.gz)
    images: dict[str, bytes] | None = None  # its tools' images, by file name in the run (store/images.py)


def verdict_note(verification: dict[str, Any]) -> str:
    """A done line's note: the verdict's status and the version of the checks that gave it."""
    status, version = verification.get("status") or "", verification.get("check_version")
    return f"{status} {version}" if status and version else status


def kept(record: dict[str, Any]) -> Outcome:
    usage = record["metadata"]["usage"]
    return Outcome("done", record["id"], record["prompt_index"], dumps(record),
                   tokens=usage["total_tokens"], cost=usage.get("cost"),
                   verdict=verdict_note(record.get("verification") or {}))


def discarded(record: dict[str, Any], reason: str) -> Outcome:
    record["discarded"] = reason
    usage = record["metadata"]["usage"]
    return Outcome("discarded", record["id"], record["prompt_index"], dumps(record),
                   tokens=usage["total_tokens"], cost=usage.get("cost"), reason=reason)


def failure(prompt_id: str, index: int, attempt: int, kind: str, message: str,
            usage: dict[str, Any] | None = None) -> Outcome:
    """A prompt that failed (retried by --resume), with the tokens and cost it spent."""
    usage = usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cost": None}
    entry = {"id": prompt_id, "prompt_index": index, "attempt": attempt, "error_kind": kind,
             "error": message, "usage": usage, "timestamp": now_iso(), "format": FORMAT}
    return Outcome("failed", prompt_id, index, dumps(entry), tokens=int(usage.get("total_tokens") or 0),
                   cost=usage.get("cost"), error_kind=kind, error=message)
