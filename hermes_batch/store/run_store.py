"""Reads and writes a run's files. Only the parent process writes; the record files are the truth.

    batch_<k>.jsonl      one trajectory per line (k = prompt_index // batch_size), append + fsync
    discarded.jsonl      records a filter dropped, with the reason; never re-run
    failed.jsonl         prompts that failed, with the error; re-run by --resume
    ledger.tsv           one line per settled prompt: where its record is and what it spent
    checkpoint.json      a summary (counts, fingerprint, settings), atomic
    verdicts.jsonl       later verdicts of kept trajectories (re-checked on --resume), the last one wins
    trajectories.jsonl   the merge of every batch file, deduplicated by id, with their latest verdicts
    statistics.json      computed from trajectories.jsonl, atomic

The ledger is what `--resume` reads instead of every record: it is appended after the records it
names are on disk (records fsynced first), so it never names a record that is not there. A crash
between the two leaves records past the ledger's end of their file: the next start reads those
tails, and only those. A `kill -9` can tear at most the last line of a file; the start cuts it,
and the prompt it belonged to is owed again. A run without a ledger (made by an older version) gets
one on its first start, from a full read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import sys
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, field_validator

from ..errors import UserError
from ..flags import Text, flag
from ..record import IMAGES_DIRECTORY, NewerFormat, Outcome, dumps, format_of, now_iso, sample_of
from ..stats import Statistics
from ..util import atomic_write, fsync_dir
from .ledger import (
    BATCH_FILE,
    DISCARDED,
    FAILED,
    KIND_LETTER,
    RECORD_FILE,
    LedgerEntry,
    RunState,
    entry_of,
    parse_ledger,
    read_ledger,
)
from .workspace import DIRECTORY as WORKSPACES
from .workspace import file_name as workspace_file

LEDGER = "ledger.tsv"
CHECKPOINT = "checkpoint.json"
TRAJECTORIES = "trajectories.jsonl"
STATISTICS = "statistics.json"
MERGED = ".merged.json"  # what trajectories.jsonl holds, so the next merge only appends
VERDICTS = "verdicts.jsonl"
DATASET_INDEX = ".dataset_index"
LOCAL_MODEL_LOG = "local_model.log"
LOCK = ".lock"
_OPEN_FILES = 64


class RunLocation(BaseModel):
    """Which run: its files are <output_dir>/<run_name>/ (flags of every command that reads or writes one)."""

    run_name: Text = flag(..., "the run: its files are <output_dir>/<run_name>/")
    output_dir: Text = flag("data", "root of run directories")

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, v: str) -> str:
        return run_name_checked(v)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


def run_name_checked(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
        raise ValueError(f"{v!r} must be 1-128 characters of letters, digits, '.', '_' or '-' (it names a directory)")
    return v


class RunLocked(UserError):
    pass


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class RunStore:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.unreadable: list[str] = []  # records the ledger names that could not be read back (merge)
        self._lock_fd: int | None = None
        self._files: OrderedDict[Path, Any] = OrderedDict()
        self._dirty: set[Path] = set()
        self._ledger_pending: list[bytes] = []
        self._ledger: Any = None
        self._verdicts: dict[str, dict[str, Any]] | None = None

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
        """Flush and close; on a full disk what could not be written stays unwritten (the ledger
        never names it, and a torn last line is cut at the next start)."""
        with contextlib.suppress(OSError):
            self.flush()
        for f in [*self._files.values(), *([self._ledger] if self._ledger is not None else [])]:
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()
        self._ledger = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def has_outputs(self) -> bool:
        if any((self.dir / name).exists() for name in (LEDGER, DISCARDED, FAILED)):
            return True
        return any(True for _ in self.dir.glob("batch_*.jsonl")) if self.dir.is_dir() else False

    def clear(self) -> None:
        """Delete a previous run's outputs (for --overwrite)."""
        names = (DISCARDED, FAILED, LEDGER, CHECKPOINT, TRAJECTORIES, STATISTICS, MERGED, DATASET_INDEX, VERDICTS)
        for path in [*self.batch_files(), *(self.dir / n for n in names)]:
            path.unlink(missing_ok=True)
        if (self.dir / WORKSPACES).is_dir():
            shutil.rmtree(self.dir / WORKSPACES)

    def batch_files(self) -> list[Path]:
        found = [(int(m.group(1)), p) for p in self.dir.glob("batch_*.jsonl") if (m := BATCH_FILE.search(p.name))]
        return [p for _, p in sorted(found)]  # numeric order: batch_2 before batch_10

    def _record_file_sizes(self) -> dict[str, int]:
        """Size of every batch, discarded and failed file, by name (one directory read)."""
        sizes = {}
        with os.scandir(self.dir) as entries:
            for e in entries:
                if e.name in (DISCARDED, FAILED) or (e.name.startswith("batch_") and BATCH_FILE.match(e.name)):
                    sizes[e.name] = e.stat().st_size
        return sizes

    # --- reading -----------------------------------------------------------------------------
    def iter_jsonl(self, path: Path, start: int = 0) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """(offset, length, record) for every parseable line from `start`; broken lines are skipped."""
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(start)
            offset = start
            for line in f:
                length = len(line)
                try:
                    rec = json.loads(line)
                except ValueError:
                    rec = None
                if isinstance(rec, dict) and isinstance(rec.get("id"), str):
                    try:
                        format_of(rec)
                    except NewerFormat as exc:
                        raise UserError(f"{path}: {exc}") from None
                    yield offset, length, rec
                offset += length

    def scan(self) -> RunState:
        """What has happened so far: the ledger, plus what the record files hold past it (after a
        crash, or in a run made before the ledger), which is added to the ledger. Torn tails are cut."""
        state = RunState()
        ledger = self.dir / LEDGER
        data = ledger.read_bytes() if ledger.exists() else b""
        if data and not data.endswith(b"\n"):  # torn by a kill: its records are re-read below
            data = data[: data.rfind(b"\n") + 1]
            _truncate(ledger, len(data))
        sizes = self._record_file_sizes()
        try:
            covered = read_ledger(data, state)
        except (ValueError, KeyError, IndexError):  # a line that is not a ledger line (edited by hand?)
            _truncate(ledger, 0)
            rebuilt = self.scan()
            rebuilt.repaired.append(f"{LEDGER}: a line in it was not a ledger line; rebuilt from the records")
            return rebuilt
        if any(end > sizes.get(name, -1) for name, end in covered.items()):
            # the files are not what the ledger says (edited by hand?): read them all again
            _truncate(ledger, 0)
            return self.scan()
        position, found = len(data), []
        for name, size in sorted(sizes.items(), key=lambda kv: _file_order(kv[0])):
            start = covered.get(name, 0)
            if size > start:
                found.extend(self._read_tail(name, start, state))
        for e, fp in found:
            if fp and fp not in state.fingerprints:
                state.fingerprints.add(fp)
                self._ledger_pending.append(f"p\t{fp}\n".encode())
                position += len(self._ledger_pending[-1])
            state.apply(e, position)
            line = e.line()
            self._ledger_pending.append(line)
            position += len(line)
        for pid in [p for p in state.failed if state.settled(p)]:
            del state.failed[pid]
        self.flush()
        return state

    def _read_tail(self, name: str, start: int, state: RunState) -> list[tuple[LedgerEntry, str | None]]:
        """The records of one file past `start`, after cutting a torn last line."""
        path = self.dir / name
        kind = "x" if name == DISCARDED else "f" if name == FAILED else "d"
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            keep = max(start, _last_newline(f, size))
            if keep < size:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
                state.repaired.append(f"{name}: dropped {size - keep} bytes of an unfinished last line")
        found = []
        for offset, length, rec in self.iter_jsonl(path, start):
            fp = (rec.get("metadata") or {}).get("config_fingerprint") if kind != "f" else None
            found.append((entry_of(kind, name, offset, length, rec), fp))
        return found

    # --- later verdicts ----------------------------------------------------------------------
    @property
    def verdicts(self) -> dict[str, dict[str, Any]]:
        """id → its latest verdict, for trajectories checked again after they were written."""
        if self._verdicts is None:
            self._verdicts = {rec["id"]: rec["verification"] for _, _, rec in self.iter_jsonl(self.dir / VERDICTS)
                              if isinstance(rec.get("verification"), dict)}
        return self._verdicts

    def add_verdict(self, prompt_id: str, verification: dict[str, Any]) -> None:
        """Append one trajectory's new verdict, durable when this returns (a line torn by a kill is
        cut first; the trajectory is then checked again)."""
        path = self.dir / VERDICTS
        if path.exists():
            with open(path, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                keep = _last_newline(f, size)
                if keep < size:
                    f.truncate(keep)
        with open(path, "ab") as f:
            f.write(dumps({"id": prompt_id, "verification": verification, "timestamp": now_iso()}))
            f.flush()
            os.fsync(f.fileno())
        self.verdicts[prompt_id] = verification

    def _verdicts_size(self) -> int:
        path = self.dir / VERDICTS
        return path.stat().st_size if path.exists() else 0

    def with_latest_verdict(self, rec: dict[str, Any]) -> bool:
        """Give a record its latest verdict; whether it changed."""
        later = self.verdicts.get(rec["id"])
        if later is None or rec.get("verification") == later:
            return False
        rec["verification"] = later
        return True

    def merged_is_behind(self) -> bool:
        """trajectories.jsonl is what the last merge wrote, and prompts were settled since (a run
        going on, a resume stopped before its merge). A merged file edited since, or one without
        a record of its merge (an older run's, one made by hand), is taken as it is."""
        mark, merged = self.read_json(MERGED), self.trajectories_path
        return (mark is not None and merged.exists() and mark.get("bytes") == merged.stat().st_size
                and (mark.get("ledger") != self.ledger_size or mark.get("verdicts", 0) != self._verdicts_size()))

    def kept_records(self) -> Iterator[dict[str, Any]]:
        """The run's kept trajectories as the run is now: its merged file, unless it is behind the
        run; else its batch files, each id once (a torn last line is skipped)."""
        merged = self.trajectories_path.exists() and not self.merged_is_behind()
        paths, dedupe = ([self.trajectories_path], False) if merged else (self.batch_files(), True)
        seen: set[str] = set()
        for path in paths:
            for _, _, rec in self.iter_jsonl(path):
                if dedupe:
                    if rec["id"] in seen:
                        continue
                    seen.add(rec["id"])
                    self.with_latest_verdict(rec)
                yield rec

    def ledger_entries(self, start: int = 0) -> Iterator[tuple[int, LedgerEntry]]:
        """The settled prompts from ledger offset `start` on (flushed first)."""
        self.flush()
        path = self.dir / LEDGER
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        for at, e in parse_ledger(data, start):
            if isinstance(e, LedgerEntry):
                yield at, e

    @property
    def ledger_size(self) -> int:
        self.flush()
        path = self.dir / LEDGER
        return path.stat().st_size if path.exists() else 0

    def read_checkpoint(self) -> dict[str, Any] | None:
        return self.read_json(CHECKPOINT)

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.dir / name).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError, RecursionError):
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

    def record(self, outcome: Outcome, batch: int) -> LedgerEntry:
        """Append a settled prompt to its file (batch_<batch>.jsonl, discarded.jsonl or failed.jsonl)
        and to the ledger; both durable after the next `flush()` (the parent group-commits). Its
        ledger entry: where the record is."""
        kind = KIND_LETTER[outcome.kind]
        if outcome.workspace is not None:  # durable before the record that names it
            (self.dir / WORKSPACES).mkdir(exist_ok=True)
            atomic_write(self.dir / workspace_file(outcome.id), outcome.workspace)
        for name, data in (outcome.images or {}).items():  # content-addressed: one already there is the same
            if not (self.dir / name).exists():
                (self.dir / IMAGES_DIRECTORY).mkdir(exist_ok=True)
                atomic_write(self.dir / name, data)
        name = f"batch_{batch}.jsonl" if kind == "d" else RECORD_FILE[kind]
        path = self.dir / name
        f = self._handle(path)
        offset = f.tell()
        f.write(outcome.line)
        self._dirty.add(path)
        note = ((outcome.reason or "discarded") if kind == "x" else (outcome.error_kind or "") if kind == "f"
                else outcome.verdict or "")
        entry = LedgerEntry(kind, outcome.id, outcome.index, name, offset, len(outcome.line), outcome.tokens,
                            outcome.cost, note)
        self._ledger_pending.append(entry.line())
        return entry

    def note_fingerprint(self, fp: str, state: RunState) -> None:
        """Say in the ledger which settings the records that follow were written with."""
        if fp not in state.fingerprints:
            state.fingerprints.add(fp)
            self._ledger_pending.append(f"p\t{fp}\n".encode())

    def write_checkpoint(self, data: dict[str, Any]) -> None:
        self.write_json(CHECKPOINT, data)

    def write_statistics(self, data: dict[str, Any]) -> None:
        self.write_json(STATISTICS, data)

    def flush(self) -> None:
        """The records first, then the ledger lines that name them: the ledger never runs ahead."""
        for path in list(self._dirty):
            f = self._files.get(path)
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
        self._dirty.clear()
        if self._ledger_pending:
            if self._ledger is None:
                self._ledger = open(self.dir / LEDGER, "ab")
            self._ledger.write(b"".join(self._ledger_pending))
            self._ledger_pending.clear()
            self._ledger.flush()
            os.fsync(self._ledger.fileno())

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        atomic_write(self.dir / name, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode())

    def read_records(self, entries: list[LedgerEntry]) -> Iterator[tuple[LedgerEntry, bytes]]:
        """Each entry's record line, read where the ledger says (a few files open at a time: a big
        run has more batch files than a process may open)."""
        handles: OrderedDict[str, Any] = OrderedDict()
        try:
            for e in entries:
                src = handles.pop(e.file, None)
                if src is None:
                    if len(handles) >= _OPEN_FILES:
                        handles.popitem(last=False)[1].close()
                    src = open(self.dir / e.file, "rb")
                handles[e.file] = src
                src.seek(e.offset)
                line = src.read(e.length)
                yield e, line if line.endswith(b"\n") else line + b"\n"
        finally:
            for h in handles.values():
                h.close()


    # --- merging -----------------------------------------------------------------------------
    def merge(self, state: RunState, index_of: dict[str, int]) -> tuple[int, Statistics]:
        """Bring trajectories.jsonl up to date: one line per kept id; returns (lines, statistics).

        Each record's prompt_index is made true for the dataset as it is now (`index_of`: id →
        position; a record whose row is gone gets null). When every trajectory already merged
        still has its index, only the new ones are appended (in prompt order among themselves),
        and the statistics saved with the last merge are added to; otherwise (rows of the dataset
        moved) the file is written again, whole, in prompt order.
        """
        self.flush()
        ledger_end = self.ledger_size
        path, mark = self.dir / TRAJECTORIES, self.read_json(MERGED)
        if mark is not None and self._mark_holds(mark, state, index_of, ledger_end):
            return self._append(mark, state, index_of, ledger_end)
        return self._rewrite(index_of, ledger_end, path)

    def _mark_holds(self, mark: dict[str, Any], state: RunState, index_of: dict[str, int], ledger_end: int) -> bool:
        path = self.dir / TRAJECTORIES
        if mark.get("version") != 1 or not path.exists() or path.stat().st_size != mark.get("bytes"):
            return False  # a merge that did not finish, or a file changed by hand
        if mark.get("verdicts", 0) != self._verdicts_size():
            return False  # trajectories were checked again: their lines change
        merged_to, moved, lines = mark.get("ledger"), mark.get("moved"), mark.get("lines")
        if not (isinstance(merged_to, int) and isinstance(moved, dict) and isinstance(lines, int)
                and isinstance(mark.get("statistics"), dict) and 0 <= merged_to <= ledger_end):
            return False  # not a mark this store wrote: merge again from the ledger
        if merged_to and self._ledger_byte(merged_to - 1) != b"\n":
            return False  # the ledger changed under it (edited by hand): its offset is mid-line
        merged = 0
        for pid, at in state.done_at.items():
            if at < merged_to:
                merged += 1
                written = moved[pid] if pid in moved else state.done[pid]
                if index_of.get(pid, -1) != (-1 if written is None else written):
                    return False
        return merged == lines  # every id merged once, as the mark says

    def _ledger_byte(self, at: int) -> bytes:
        with open(self.dir / LEDGER, "rb") as f:
            f.seek(at)
            return f.read(1)

    def _append(self, mark: dict[str, Any], state: RunState, index_of: dict[str, int],
                ledger_end: int) -> tuple[int, Statistics]:
        merged_to, moved = mark["ledger"], mark["moved"]
        stats = Statistics.from_state(mark["statistics"])
        chosen: dict[str, LedgerEntry] = {}
        for at, e in self.ledger_entries(merged_to):
            if at >= ledger_end:
                break
            first = state.done_at.get(e.id)
            if e.kind == "d" and e.id not in chosen and (first is None or first >= merged_to):
                chosen[e.id] = e
        size = self._write_in_order(self.dir / TRAJECTORIES, "ab", chosen.values(), index_of, moved, stats)
        count = mark["lines"] + len(chosen)
        self._write_mark(size, ledger_end, count, moved, stats)
        return count, stats

    def _rewrite(self, index_of: dict[str, int], ledger_end: int, path: Path) -> tuple[int, Statistics]:
        stats, moved = Statistics(), dict[str, int | None]()
        chosen: dict[str, LedgerEntry] = {}
        for at, e in self.ledger_entries():
            if at >= ledger_end:
                break
            if e.kind == "d" and e.id not in chosen:
                chosen[e.id] = e
        tmp = self.dir / f".{TRAJECTORIES}.tmp-{os.getpid()}"
        size = self._write_in_order(tmp, "wb", chosen.values(), index_of, moved, stats)
        os.replace(tmp, path)
        fsync_dir(self.dir)
        self._write_mark(size, ledger_end, len(chosen), moved, stats)
        return len(chosen), stats

    def _write_in_order(self, path: Path, mode: str, chosen: Iterable[LedgerEntry], index_of: dict[str, int],
                        moved: dict[str, int | None], stats: Statistics) -> int:
        """Write (or append) the chosen trajectories to `path` in prompt order, fsynced; its size after."""
        with open(path, mode) as out:
            for e, line in self.read_records(_in_prompt_order(chosen, index_of)):
                try:
                    out.write(self._true_line(e, line, index_of, moved, stats))
                except (ValueError, AttributeError, TypeError):  # not a record any more (changed by hand)
                    self.unreadable.append(f"{e.file} at byte {e.offset} ({e.id})")
            out.flush()
            os.fsync(out.fileno())
            return out.tell()

    def _true_line(self, e: LedgerEntry, line: bytes, index_of: dict[str, int], moved: dict[str, int | None],
                   stats: Statistics) -> bytes:
        """The record with its prompt_index for the dataset as it is now and its latest verdict,
        counted into `stats`."""
        rec = json.loads(line)
        changed = self.with_latest_verdict(rec)
        stats.add(rec)
        now = index_of.get(e.id)
        if now == rec.get("prompt_index"):
            return dumps(rec) if changed else line
        rec["prompt_index"] = now
        if now != e.index:
            moved[e.id] = now
        return dumps(rec)

    def _write_mark(self, size: int, ledger_end: int, lines: int, moved: dict[str, int | None],
                    stats: Statistics) -> None:
        self.write_json(MERGED, {"version": 1, "bytes": size, "ledger": ledger_end, "lines": lines,
                                 "moved": moved, "statistics": stats.state(), "verdicts": self._verdicts_size()})


def _in_prompt_order(entries: Iterable[LedgerEntry], index_of: dict[str, int]) -> list[LedgerEntry]:
    def key(e: LedgerEntry) -> tuple[int, int, str]:
        index = index_of.get(e.id)
        return (sys.maxsize if index is None else index, sample_of(e.id), e.id)  # sample 2 before sample 10
    return sorted(entries, key=key)


def _file_order(name: str) -> tuple[int, int]:
    m = BATCH_FILE.match(name)
    return (0, int(m.group(1))) if m else (1, 0 if name == DISCARDED else 1)


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


def _truncate(path: Path, size: int) -> None:
    with open(path, "rb+") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())
