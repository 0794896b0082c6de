"""Reads the JSONL dataset into `PromptRecord`s with stable ids; bad rows are reported and skipped."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError

RESERVED = ("prompt", "image", "docker_image", "cwd")


@dataclass
class PromptRecord:
    id: str  # content hash + occurrence number: stable across edits elsewhere and reorderings
    index: int  # position among the valid rows of this dataset (the record's prompt_index)
    line: int  # 1-based line in the file, for messages
    prompt: str
    image: str | None = None
    cwd: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # every other field, carried into metadata


@dataclass
class RowProblem:
    line: int
    message: str


@dataclass
class Dataset:
    path: Path
    records: list[PromptRecord]
    problems: list[RowProblem]


class DatasetError(UserError):
    pass


def content_hash(row: dict[str, Any]) -> str:
    canonical = json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _check_row(row: Any) -> str | None:
    """Why this row cannot be used, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    if "prompt" not in row:
        return "missing the required field 'prompt'"
    prompt = row["prompt"]
    if not isinstance(prompt, str):
        return f"'prompt' must be a string, got {type(prompt).__name__}"
    if not prompt.strip():
        return "'prompt' is empty"
    for key in ("image", "docker_image"):
        if key in row and row[key] is not None and (not isinstance(row[key], str) or not row[key].strip()):
            return f"'{key}' must be a non-empty string"
    cwd = row.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        return f"'cwd' must be an absolute path string, got {cwd!r}"
    return None


def load_dataset(path: str | Path, max_samples: int | None = None) -> Dataset:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset file not found: {path}")
    if not path.is_file():
        raise DatasetError(f"dataset path is not a file: {path}")
    records: list[PromptRecord] = []
    problems: list[RowProblem] = []
    seen: Counter[str] = Counter()
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if max_samples is not None and len(records) >= max_samples:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problems.append(RowProblem(lineno, f"not valid UTF-8 ({exc.reason} at byte {exc.start})"))
                continue
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                problems.append(RowProblem(lineno, f"invalid JSON ({exc.msg} at column {exc.colno})"))
                continue
            why = _check_row(row)
            if why:
                problems.append(RowProblem(lineno, why))
                continue
            digest = content_hash(row)
            seen[digest] += 1
            records.append(
                PromptRecord(
                    id=f"{digest}-{seen[digest] - 1}",
                    index=len(records),
                    line=lineno,
                    prompt=row["prompt"],
                    image=row.get("image") or row.get("docker_image"),
                    cwd=row.get("cwd"),
                    extra={k: v for k, v in row.items() if k not in RESERVED},
                )
            )
    return Dataset(path=path, records=records, problems=problems)
