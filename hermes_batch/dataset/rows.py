"""Reads the JSONL dataset into `PromptRecord`s with stable ids; bad rows are reported and skipped.

A run keeps an index of its dataset (each row's id, line and byte offset, and a sha256 of the bytes
it covers): `--resume` on a big dataset reads the index instead of hashing every row, parses only
the rows it still has to run, and of a file that grew, reads only what was appended.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import CHECK_KEYS, TASK_KEYS, Task, TaskError, directory_digests, harbor, read_task, source_directories
from ..errors import UserError
from ..util import say

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
    task: Task | None = None  # its starting state and checks (checks/task.py), when it has them

    @property
    def sandbox_image(self) -> str | None:
        """The image its sandbox runs: the row's own, else its task's (a Harbor task's)."""
        return self.image or (self.task.image if self.task else None)

    @property
    def sandbox_cwd(self) -> str | None:
        """Where its commands start: the row's own, else its task's."""
        return self.cwd or (self.task.cwd if self.task else None)


@dataclass
class RowProblem:
    line: int
    message: str


@dataclass
class Dataset:
    """The valid rows, by position: `ids[i]` is row i's id, `lines[i]` its line in the file."""

    path: Path
    ids: list[str]
    lines: list[int]
    offsets: list[int]  # byte offset of each row's line, to read only the rows a run still needs
    problems: list[RowProblem]
    key: dict[str, Any] = field(default_factory=dict)  # bytes read: size, sha256, lines
    parsed: dict[int, PromptRecord] = field(default_factory=dict)  # the rows parsed by this load
    from_index: bool = False
    # the directories rows read their starting state from, with digests: an index whose are stale is not used
    directories: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def records(self) -> list[PromptRecord]:
        return self.records_at(range(len(self.ids)))

    def records_at(self, indices: Iterable[int]) -> list[PromptRecord]:
        """The rows at these positions: parsed already, or read again at their offsets."""
        out = []
        with self.path.open("rb") as f:
            for i in indices:
                rec = self.parsed.get(i)
                if rec is None:
                    f.seek(self.offsets[i])
                    rec = _record(json.loads(f.readline()), self.ids[i], i, self.lines[i], self.path.parent)
                out.append(rec)
        return out

    def write_index(self, path: Path) -> None:
        """Keep this dataset's ids for the next invocation (see the module's docstring)."""
        from ..util import atomic_write

        head = {"version": 2, "key": self.key, "problems": [[p.line, p.message] for p in self.problems],
                "directories": self.directories}
        atomic_write(path, b"\n".join(json.dumps(part).encode() for part in (head, self.ids, self.lines, self.offsets)))

SAID_PROBLEMS = 20  # rejected rows said one by one; the rest are counted


class DatasetError(UserError):
    pass


def content_hash(row: dict[str, Any], directories: dict[str, str] | None = None) -> str:
    """A row's identity: everything but its checks (a row whose check is fixed is the same row), and
    the content of the directories its starting state is read from (task.source_directories)."""
    return _digest({**{k: v for k, v in row.items() if k not in CHECK_KEYS},
                    **({"\0directories": directories} if directories else {})})


def _digest(value: dict[str, Any]) -> str:
    canonical = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _checks_hash(row: dict[str, Any]) -> str:
    return _digest({k: row[k] for k in CHECK_KEYS if k in row})


MAX_DEPTH = 64  # of a row's nested values: deeper ones cannot travel to a worker (pickling recurses)


def _depth(value: Any) -> int:
    deepest, level = 0, [(value, 1)]
    while level:
        item, depth = level.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        if isinstance(item, dict):
            level.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            level.extend((v, depth + 1) for v in item)
    return deepest


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _too_deep(text: str) -> bool:
    """Whether a row's JSON text nests deeper than MAX_DEPTH, told before parsing it: a parser
    deep in its recursion runs whatever finalizer the garbage collector picks with no stack left."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for bracket in re.findall(r"[\[\]{}]", _STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _check_row(row: Any) -> str | None:
    """Why this row's own fields cannot be used, or None (its task's are read_task's)."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    if _depth(row) > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
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


def _read_row(row: Any, base: Path) -> tuple[Task | None, str | None]:
    """The row's task (its files read once) and why the row cannot be used, or None."""
    why = _check_row(row)
    if why:
        return None, why
    try:
        task = read_task(row, base)
    except TaskError as exc:
        return None, str(exc)
    return task, _not_text(row)


def _not_text(row: dict[str, Any]) -> str | None:
    """A lone surrogate (`"\\ud800"` is valid JSON) is half of a UTF-16 pair: no text holds one."""
    for key, value in row.items():
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            return f"'{key}' holds a lone surrogate ({exc.object[exc.start]!r}), half of a UTF-16 pair, which is not text"
    return None


def _record(row: dict[str, Any], prompt_id: str, index: int, line: int, base: Path,
            task: Task | None = None) -> PromptRecord:
    """The row as the run holds it; `task`, when it was read already (else it is read now)."""
    return PromptRecord(
        id=prompt_id, index=index, line=line, prompt=row["prompt"],
        image=row.get("image") or row.get("docker_image"), cwd=row.get("cwd"),
        extra={k: v for k, v in row.items() if k not in RESERVED and k not in TASK_KEYS},
        task=task if task is not None else read_task(row, base),
    )


def _digest_of_first(path: Path, size: int) -> tuple[Any, bool] | None:
    """sha256 of the file's first `size` bytes and whether they end a line; None if it is shorter."""
    digest, left, last = hashlib.sha256(), size, b"\n"
    with path.open("rb") as f:
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                return None
            digest.update(chunk)
            left -= len(chunk)
            last = chunk[-1:]
    return digest, last == b"\n"


def _from_index(path: Path, size: int, index: Path) -> tuple[Dataset, Any] | None:
    """The rows an index holds, if the file (`size` bytes now) still starts with the bytes it was made from."""
    try:
        head, ids, lines, offsets = (json.loads(part) for part in index.read_bytes().split(b"\n"))
        key = head["key"]
        if head.get("version") != 2 or size < key["size"]:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = _digest_of_first(path, key["size"])
    if found is None or found[0].hexdigest() != key["sha256"] or (not found[1] and size > key["size"]):
        return None  # edited, or a last line without its newline has since been written on
    directories = head.get("directories") or {}  # (an index made before they counted has none)
    if directories and directory_digests(list(directories), path.parent) != directories:
        return None  # a row's files directory or Harbor environment changed: its id did too
    problems = [RowProblem(line, message) for line, message in head["problems"]]
    return Dataset(path, ids, lines, offsets, problems, key, from_index=True, directories=directories), found[0]


def _first_checks(path: Path, ds: Dataset, row_digest: str) -> tuple[int, str]:
    """(line, the hash of its checks) of the first row with this digest, which an index holds (a row
    appended since that asks the same must not check it differently either)."""
    i = ds.ids.index(f"{row_digest}-0")
    with path.open("rb") as f:
        f.seek(ds.offsets[i])
        row = json.loads(f.readline())
    return ds.lines[i], _checks_hash(row) if any(k in row for k in CHECK_KEYS) else ""


def read_source(source: str | Path, rows_dir: Path, max_samples: int | None = None,
                index: Path | None = None) -> Dataset:
    """What `--dataset_file` names, read and its rejected rows said: a JSONL file, or a directory of
    Harbor tasks, whose rows (harbor.py) are written in `rows_dir` first."""
    path = Path(source)
    if path.is_dir():
        path = harbor.write_rows(path, rows_dir)
    dataset = load_dataset(path, max_samples, index=index)
    for problem in dataset.problems[:SAID_PROBLEMS]:
        say(f"{dataset.path}:{problem.line}: {problem.message} (row skipped)")
    if len(dataset.problems) > SAID_PROBLEMS:
        say(f"... and {len(dataset.problems) - SAID_PROBLEMS} more rejected rows")
    return dataset


def load_dataset(path: str | Path, max_samples: int | None = None, index: Path | None = None) -> Dataset:
    """The dataset's valid rows and the problems of the others. `index` is a run's index of this
    file (without `max_samples` only): when the file starts with the bytes it was made from, only
    what was appended since is read."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset file not found: {path}")
    if not path.is_file():
        raise DatasetError(f"dataset path is not a file: {path}")
    size = path.stat().st_size
    known = _from_index(path, size, index) if index is not None and max_samples is None else None
    if known is not None and known[0].key["size"] == size:
        return known[0]
    ds, digest = known or (Dataset(path, [], [], [], [], {"size": 0, "lines": 0}), hashlib.sha256())
    seen: Counter[str] = Counter(pid.rsplit("-", 1)[0] for pid in ds.ids)
    checked_as: dict[str, tuple[int, str]] = {}  # row digest → (its first line, the hash of its checks)
    offset, lineno = ds.key["size"], ds.key["lines"]
    with path.open("rb") as f:
        f.seek(offset)  # past what the index holds
        for raw in f:
            lineno += 1
            if max_samples is not None and len(ds.ids) >= max_samples:
                break
            digest.update(raw)
            at, offset = offset, offset + len(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                ds.problems.append(RowProblem(lineno, f"not valid UTF-8 ({exc.reason} at byte {exc.start})"))
                continue
            if not text.strip():
                continue
            if _too_deep(text):
                ds.problems.append(RowProblem(lineno, f"nested more than {MAX_DEPTH} levels deep"))
                continue
            try:
                row = json.loads(text.rstrip("\r\n"))  # a row cut short is at fault on its own line, not the next
            except json.JSONDecodeError as exc:
                ds.problems.append(RowProblem(lineno, f"invalid JSON ({exc.msg} at column {exc.colno})"))
                continue
            except (ValueError, RecursionError) as exc:  # an integer of 5,000 digits, arrays 2,000 deep
                ds.problems.append(RowProblem(lineno, f"JSON this tool cannot hold ({exc})"))
                continue
            task, why = _read_row(row, path.parent)
            if why:
                ds.problems.append(RowProblem(lineno, why))
                continue
            directories = source_directories(row, path.parent)
            ds.directories.update(directories)
            row_digest = content_hash(row, directories)
            checks = _checks_hash(row) if any(k in row for k in CHECK_KEYS) else ""
            if row_digest not in checked_as and seen[row_digest]:  # its first is in the index: read it again
                checked_as[row_digest] = _first_checks(path, ds, row_digest)
            first = checked_as.setdefault(row_digest, (lineno, checks))
            if first[1] != checks:  # one task, two ways to score it: which trajectory got which is luck
                ds.problems.append(RowProblem(lineno, f"asks the agent exactly what line {first[0]} asks, but checks "
                                                      "it differently: give a task one set of checks (or make the rows differ)"))
                continue
            seen[row_digest] += 1
            rec = _record(row, f"{row_digest}-{seen[row_digest] - 1}", len(ds.ids), lineno, path.parent, task)
            ds.parsed[rec.index] = rec
            ds.ids.append(rec.id)
            ds.lines.append(lineno)
            ds.offsets.append(at)
    ds.key = {"size": offset, "sha256": digest.hexdigest(), "lines": lineno}
    ds.from_index = False
    return ds

