"""Writing rows out: JSON lines, Parquet (row group by row group, so memory stays flat), a `datasets`
dataset saved to disk, a file per trajectory; each written beside its place and moved in whole; and
the upload to the Hub."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .options import ExportError

WRITE_BATCH = 500  # rows per Parquet row group


def write_lines(path: Path, items: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
    except BaseException:  # a half-written file is no export
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def write_parquet(path: Path, schema_of: Callable[[], Any], rows: Iterator[dict[str, Any]]) -> None:
    """`schema_of` builds the Arrow schema once pyarrow is known to import (it imports pyarrow itself)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ExportError("Parquet needs pyarrow: pip install -e '.[export]'") from exc
    schema = schema_of()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for batch in _batches(rows):
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def write_dataset(path: Path, schema_of: Callable[[], Any], rows: Iterator[dict[str, Any]]) -> None:
    """Through a Parquet file (written row group by row group), so memory stays flat."""
    try:
        import datasets
    except ImportError as exc:
        raise ExportError("a datasets dataset needs the datasets package: pip install -e '.[export]'") from exc
    with tempfile.TemporaryDirectory(prefix="hermes-export-") as tmp:
        parquet = Path(tmp) / "rows.parquet"
        write_parquet(parquet, schema_of, rows)
        features = datasets.Features.from_arrow_schema(schema_of())
        ds = datasets.Dataset.from_parquet(str(parquet), features=features, cache_dir=str(Path(tmp) / "cache"))
        ds.save_to_disk(str(path))


def write_rows(output: Path, rows: Iterator[dict[str, Any]], schema: Callable[[], Any]) -> None:
    """Rows as `output` asks: `.jsonl`, `.parquet`, or (no suffix) a datasets dataset of `schema()`."""
    suffix = output.suffix.lower()
    if suffix == ".jsonl":
        output.parent.mkdir(parents=True, exist_ok=True)
        write_lines(output, rows)
        return
    (write_parquet if suffix == ".parquet" else write_dataset)(output, schema, rows)


def push_to_hub(output: Path, repo: str, fmt: str, card: Path | None = None) -> str:
    """Upload an exported file or directory, and its dataset card as the repo's README.md, to a
    dataset repo on the Hub; its URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:
        raise ExportError("--push_to_hub needs huggingface_hub: pip install -e '.[export]'") from exc
    api = HfApi()
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    if output.is_dir():
        api.upload_folder(folder_path=str(output), repo_id=repo, repo_type="dataset",
                          path_in_repo="sessions" if fmt == "sts" else "")
    else:
        api.upload_file(path_or_fileobj=str(output), path_in_repo=f"data/{output.name}", repo_id=repo,
                        repo_type="dataset")
    if card is not None and card.exists():
        api.upload_file(path_or_fileobj=str(card), path_in_repo="README.md", repo_id=repo, repo_type="dataset")
    return f"https://huggingface.co/datasets/{repo}"
