"""A benchmark's items as text, for decontamination (`--decontaminate=FILE|DIR|NAME,...`):

    FILE.jsonl / .json   one item per line (a JSON array file: its elements)
    FILE.parquet         one item per row
    DIR                  a Harbor task (instruction.md, solution/, tests/), a directory of them, a
                         `datasets` dataset saved to disk, or a directory of .jsonl/.parquet files
    NAME                 a `datasets` dataset this machine already holds (read offline, never fetched)

An item's text is every string it holds (its prompt and its solution, whatever the fields are
called; the id field apart), a Harbor task's the instruction, the solution's files and the tests'.
Each source has a content key (a SHA-256 of its bytes; a dataset's fingerprints): the index cache's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ExportError

ID_FIELDS = ("id", "task_id", "instance_id", "problem_id", "question_id", "uid", "name")
LARGEST_FILE = 4 * 1024 * 1024  # a Harbor task's file read at most (solutions and tests are text)


@dataclass
class Benchmark:
    source: str  # as the user named it
    kind: str  # jsonl | parquet | harbor | datasets
    key: str  # what its content hashes to

    def items(self) -> Iterator[tuple[str, str]]:
        """(item id, its text), in order."""
        path = Path(self.source)
        if self.kind == "datasets":
            for split, ds in _datasets(self.source):
                for n, row in enumerate(ds):
                    yield _item(row, f"{split}:{n}")
        elif self.kind == "harbor":
            for task in _harbor_tasks(path):
                yield (task.name if task != path else path.name), "\n".join(text for _, text in _task_files(task))
        else:
            for file in _files(path):
                yield from _file_items(file)


def benchmark(source: str) -> Benchmark:
    """What `source` names, and its content key; ExportError when it names nothing readable."""
    path = Path(source)
    if path.is_file():
        if path.suffix.lower() not in (".jsonl", ".json", ".parquet"):
            raise ExportError(f"--decontaminate={source}: give .jsonl, .json or .parquet files, a directory, or a "
                              "datasets name")
        return Benchmark(source, "parquet" if path.suffix.lower() == ".parquet" else "jsonl", _digest([path], path))
    if path.is_dir():
        if _harbor_tasks(path):
            h = hashlib.sha256()
            for task in _harbor_tasks(path):
                for name, text in _task_files(task):
                    h.update(f"{task.name}/{name}\0{len(text)}\0".encode() + text.encode())
            return Benchmark(source, "harbor", "harbor:" + h.hexdigest())
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return Benchmark(str(path), "datasets", _digest(sorted(p for p in path.rglob("*") if p.is_file()), path))
        files = _files(path)
        if not files:
            raise ExportError(f"--decontaminate={source}: the directory holds no Harbor task (instruction.md), "
                              "datasets dataset, or .jsonl/.parquet file")
        return Benchmark(source, "jsonl", _digest(files, path))
    try:
        fingerprints = [f"{split}:{ds._fingerprint}" for split, ds in _datasets(source)]
    except ExportError:
        raise
    except Exception as exc:  # datasets says why in its own words (not cached here, offline)
        raise ExportError(f"--decontaminate={source}: no such file or directory, and no datasets dataset of that "
                          f"name on this machine (read offline: {type(exc).__name__}: {str(exc)[:300]})") from None
    return Benchmark(source, "datasets", "datasets:" + hashlib.sha256("\n".join(fingerprints).encode()).hexdigest())


def _digest(files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(root) if f != root else f.name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as stream:
            while chunk := stream.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in (".jsonl", ".json", ".parquet"))


def _file_items(path: Path) -> Iterator[tuple[str, str]]:
    name = path.name
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ExportError("a Parquet benchmark needs pyarrow: pip install -e '.[export]'") from exc
        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1000):
            for row in batch.to_pylist():
                n += 1
                yield _item(row, f"{name}:{n}")
        return
    with open(path, encoding="utf-8") as f:
        if path.suffix.lower() == ".json":
            data = json.load(f)
            for n, row in enumerate(data if isinstance(data, list) else [data], start=1):
                yield _item(row, f"{name}:{n}")
            return
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ExportError(f"--decontaminate: {path} line {n} is not JSON ({exc})") from None
                yield _item(row, f"{name}:{n}")


def _item(row: Any, fallback: str) -> tuple[str, str]:
    if not isinstance(row, dict):
        return fallback, "\n".join(_strings(row))
    ident = next((str(row[k]) for k in ID_FIELDS if isinstance(row.get(k), (str, int)) and row.get(k) != ""), fallback)
    return ident, "\n".join(s for k, v in row.items() if k not in ID_FIELDS for s in _strings(v))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _harbor_tasks(path: Path) -> list[Path]:
    if (path / "instruction.md").is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / "instruction.md").is_file())


def _task_files(task: Path) -> list[tuple[str, str]]:
    """instruction.md, then every text file of solution/ and tests/."""
    out = [("instruction.md", (task / "instruction.md").read_text(encoding="utf-8", errors="replace"))]
    for part in ("solution", "tests"):
        for f in sorted((task / part).rglob("*")) if (task / part).is_dir() else []:
            if f.is_file() and f.stat().st_size <= LARGEST_FILE:
                try:
                    out.append((str(f.relative_to(task)), f.read_text(encoding="utf-8")))
                except UnicodeDecodeError:
                    continue  # a binary file: no text to match
    return out


def _datasets(source: str) -> list[tuple[str, Any]]:
    """(split, dataset) of a dataset saved to disk, or of a name in this machine's cache (offline)."""
    try:
        import datasets
        import huggingface_hub.constants as hub
    except ImportError as exc:
        raise ExportError("--decontaminate with a datasets dataset needs datasets: pip install -e '.[export]'") from exc
    before = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True  # never fetched: an export runs offline
    try:
        loaded = datasets.load_from_disk(source) if Path(source).is_dir() else datasets.load_dataset(source)
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = before
    if isinstance(loaded, datasets.DatasetDict):
        return list(loaded.items())
    return [("train", loaded)]
