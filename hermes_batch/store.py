"""Reads and writes a run's files. Only the parent process writes; the batch files are the truth.

    batch_<k>.jsonl      one trajectory per line (k = prompt_index // batch_size), append + fsync
    discarded.jsonl      records a filter dropped, with the reason; never re-run
    failed.jsonl         prompts that failed, with the error; re-run by --resume
    checkpoint.json      a summary (completed indices and ids, per-batch counts, fingerprint), atomic
    trajectories.jsonl   the merge of every batch file, deduplicated by id, atomic
    statistics.json      computed from trajectories.jsonl, atomic

A `kill -9` can tear at most the last line of a file; `repair()` cuts such a tail before anything
is appended, and the prompt it belonged to is simply owed again.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError
from .records import Outcome, dumps

BATCH_FILE = re.compile(r"batch_(\d+)\.jsonl$")
DISCARDED = "discarded.jsonl"
FAILED = "failed.jsonl"
CHECKPOINT = "checkpoint.json"
TRAJECTORIES = "trajectories.jsonl"
STATISTICS = "statistics.json"
LOCAL_MODEL_LOG = "local_model.log"
LOCK = ".lock"
_OPEN_FILES = 64


class RunLocked(UserError):
    pass


def atomic_write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync the directory: the file is either old or new, never torn."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class RunState:
    """What the files say has happened to each prompt id."""

    done: dict[str, int] = field(default_factory=dict)  # id → prompt_index
    discarded: dict[str, str] = field(default_factory=dict)  # id → reason
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)  # id → last failure (not yet done)
    attempts: dict[str, int] = field(default_factory=dict)  # id → failures so far
    fingerprints: set[str] = field(default_factory=set)
    tokens: int = 0  # spent by every prompt so far (kept, discarded and failed)
    cost: float = 0.0  # USD, as the provider reported it

    def add_spend(self, usage: dict[str, Any] | None) -> None:
        if usage:
            self.tokens += int(usage.get("total_tokens") or 0)
            self.cost += float(usage.get("cost") or 0.0)

    def settled(self, prompt_id: str) -> bool:
        return prompt_id in self.done or prompt_id in self.discarded


class RunStore:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self._lock_fd: int | None = None
        self._files: OrderedDict[Path, Any] = OrderedDict()
        self._dirty: set[Path] = set()

    # --- lifecycle ---------------------------------------------------------------------------
    def lock(self) -> None:
        """One writer per run directory: a second invocation on the same run is refused."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunLocked(f"run directory {self.dir} is in use by {holder}; wait for it to finish or use another --run_name") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        self.flush()
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def has_outputs(self) -> bool:
        return any(self.batch_files()) or (self.dir / DISCARDED).exists() or (self.dir / FAILED).exists()

    def clear(self) -> None:
        """Delete a previous run's outputs (for --overwrite)."""
        for path in [*self.batch_files(), *(self.dir / n for n in (DISCARDED, FAILED, CHECKPOINT, TRAJECTORIES, STATISTICS))]:
            path.unlink(missing_ok=True)

    def batch_files(self) -> list[Path]:
        found = [(int(m.group(1)), p) for p in self.dir.glob("batch_*.jsonl") if (m := BATCH_FILE.search(p.name))]
        return [p for _, p in sorted(found)]  # numeric order: batch_2 before batch_10

    def repair(self) -> list[str]:
        """Cut a torn last line (left by a kill mid-write) off every JSONL file we append to."""
        repaired = []
        for path in [*self.batch_files(), self.dir / DISCARDED, self.dir / FAILED]:
            if not path.exists() or path.stat().st_size == 0:
                continue
            with open(path, "rb+") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) == b"\n":
                    continue
                size = f.seek(0, os.SEEK_END)
                keep = _last_newline(f, size)
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
                repaired.append(f"{path.name}: dropped {size - keep} bytes of an unfinished last line")
        return repaired

    # --- reading -----------------------------------------------------------------------------
    def iter_jsonl(self, path: Path) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """(offset, length, record) for every parseable line; broken lines are skipped."""
        if not path.exists():
            return
        with open(path, "rb") as f:
            offset = 0
            for line in f:
                length = len(line)
                try:
                    rec = json.loads(line)
                except ValueError:
                    rec = None
                if isinstance(rec, dict) and isinstance(rec.get("id"), str):
                    yield offset, length, rec
                offset += length

    def scan(self) -> RunState:
        state = RunState()
        for path in self.batch_files():
            for _, _, rec in self.iter_jsonl(path):
                state.done.setdefault(rec["id"], rec.get("prompt_index", -1))
                state.add_spend((rec.get("metadata") or {}).get("usage"))
                fp = (rec.get("metadata") or {}).get("config_fingerprint")
                if fp:
                    state.fingerprints.add(fp)
        for _, _, rec in self.iter_jsonl(self.dir / DISCARDED):
            state.discarded.setdefault(rec["id"], rec.get("discarded", "discarded"))
            state.add_spend((rec.get("metadata") or {}).get("usage"))
        for _, _, rec in self.iter_jsonl(self.dir / FAILED):
            state.attempts[rec["id"]] = state.attempts.get(rec["id"], 0) + 1
            state.add_spend(rec.get("usage"))
            if not state.settled(rec["id"]):
                state.failed[rec["id"]] = rec
        for pid in list(state.failed):
            if state.settled(pid):
                del state.failed[pid]
        return state

    def read_checkpoint(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.dir / CHECKPOINT).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    # --- writing -----------------------------------------------------------------------------
    def _handle(self, path: Path):
        f = self._files.pop(path, None)
        if f is None:
            if len(self._files) >= _OPEN_FILES:
                old_path, old = self._files.popitem(last=False)
                if old_path in self._dirty:
                    old.flush()
                    os.fsync(old.fileno())
                    self._dirty.discard(old_path)
                old.close()
            f = open(path, "ab")
        self._files[path] = f
        return f

    @property
    def trajectories_path(self) -> Path:
        return self.dir / TRAJECTORIES

    @property
    def statistics_path(self) -> Path:
        return self.dir / STATISTICS

    @property
    def local_model_log(self) -> Path:
        return self.dir / LOCAL_MODEL_LOG

    def record(self, outcome: Outcome, batch: int) -> None:
        """Append a settled prompt to its file: batch_<batch>.jsonl, discarded.jsonl or failed.jsonl."""
        name = {"done": f"batch_{batch}.jsonl", "discarded": DISCARDED, "failed": FAILED}[outcome.kind]
        self.append(name, outcome.line)

    def write_checkpoint(self, data: dict[str, Any]) -> None:
        self.write_json(CHECKPOINT, data)

    def write_statistics(self, data: dict[str, Any]) -> None:
        self.write_json(STATISTICS, data)

    def append(self, name: str, line: bytes) -> None:
        """Buffered append of one JSON line; durable after the next `flush()` (the parent group-commits)."""
        path = self.dir / name
        self._handle(path).write(line)
        self._dirty.add(path)

    def flush(self) -> None:
        for path in list(self._dirty):
            f = self._files.get(path)
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
        self._dirty.clear()

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        atomic_write(self.dir / name, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode())

    # --- merging -----------------------------------------------------------------------------
    def merge(self, on_record: Callable[[dict[str, Any]], None] | None = None,
              index_of: dict[str, int] | None = None) -> int:
        """Write trajectories.jsonl from every batch file: one line per id, by prompt_index.

        With `index_of` (id → position in the dataset as it is now), each record's prompt_index is
        made true for that dataset; a record whose row is no longer there gets null and goes last.
        Only such records are re-encoded; the others are copied byte for byte.
        """
        self.flush()
        kept: dict[str, tuple[int, str, Path, int, int, bytes | None]] = {}
        for path in self.batch_files():
            for offset, length, rec in self.iter_jsonl(path):
                if rec["id"] in kept:
                    continue
                index = rec.get("prompt_index")
                fixed = None
                if index_of is not None and index_of.get(rec["id"]) != index:
                    index = rec["prompt_index"] = index_of.get(rec["id"])
                    fixed = dumps(rec)
                order = index if isinstance(index, int) else sys.maxsize
                kept[rec["id"]] = (order, rec["id"], path, offset, length, fixed)
                if on_record:
                    on_record(rec)
        tmp = self.dir / f".{TRAJECTORIES}.tmp-{os.getpid()}"
        # a few readers, most recently used kept: a big run has more batch files than a process may open
        handles: OrderedDict[Path, Any] = OrderedDict()
        try:
            with open(tmp, "wb") as out:
                for _, _, path, offset, length, fixed in sorted(kept.values(), key=lambda k: k[:2]):
                    if fixed is not None:
                        out.write(fixed)
                        continue
                    src = handles.pop(path, None)
                    if src is None:
                        if len(handles) >= _OPEN_FILES:
                            handles.popitem(last=False)[1].close()
                        src = open(path, "rb")
                    handles[path] = src
                    src.seek(offset)
                    line = src.read(length)
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                out.flush()
                os.fsync(out.fileno())
        finally:
            for h in handles.values():
                h.close()
        os.replace(tmp, self.dir / TRAJECTORIES)
        _fsync_dir(self.dir)
        return len(kept)


def _last_newline(f, size: int) -> int:
    """Offset just after the last b'\\n' in the file (0 if none)."""
    pos = size
    while pos > 0:
        step = min(65536, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0
