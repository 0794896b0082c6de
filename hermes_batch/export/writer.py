"""Export a run's kept trajectories for training, one record at a time (memory stays flat), in one of
FORMATS, each a module of this folder with its own `write`:

    openai      one row per trajectory: messages, tools and metadata (openai.py)
    sharegpt    the records as the run wrote them (Hermes format), filtered (sharegpt.py)
    sts         the Hub's Session Trace Simple format, one JSONL file per trajectory (sts.py)
    preference  a passing and a failing sample of one prompt, as TRL's preference rows (preference.py)
    atif        one ATIF document (Harbor's format) per trajectory, validated (atif.py)
    vision      TRL's layout for vision models: text and image parts, an images column (vision.py)
    tokens      token-exact rows: input_ids, loss_mask, logprobs, reward per segment (tokens.py)

Written as `.jsonl`, `.parquet`, or (a path without a suffix) a `datasets` dataset saved to disk;
`sts` and `atif` write a directory of files. Every row is checked before it is written (rows.py);
curation across the samples of a prompt (`--keep`, the pass-rate window, the pairs) is curate.py's;
duplicates, contamination and masking are clean/'s, and every export writes a dataset card beside
its output (clean/card.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import atif, openai, preference, sharegpt, sts, tokens, trainers, vision
from .clean import Cleaner, write_card
from .compress import Compression
from .curate import Curation
from .options import ExportError, Filters, ImageOptions
from .rows import Report, Rows


@dataclass(frozen=True)
class Format:
    write: Callable[[Rows, Path], None]  # the checked rows to `output`
    per_trajectory: bool = False  # a directory of one file per trajectory
    pairs: bool = False  # rows are pairs of samples (--samples)
    compresses: bool = False  # --max_tokens applies
    fits_itself: bool = False  # --max_tokens fits the format's own rows (token ids), not the openai rows
    needs: tuple[str, str] | None = None  # (a module, what to install) checked before anything is read


FORMATS: dict[str, Format] = {
    "openai": Format(openai.write, compresses=True),
    "sharegpt": Format(sharegpt.write, compresses=True),
    "sts": Format(sts.write, per_trajectory=True),
    "preference": Format(preference.write, pairs=True),
    "atif": Format(atif.write, per_trajectory=True,
                   needs=("atif", "--format=atif checks each document with the atif package: pip install -e '.[export]'")),
    "tokens": Format(tokens.write, compresses=True, fits_itself=True),
    "atropos": Format(trainers.write_atropos, compresses=True, fits_itself=True),
    "skyrl": Format(trainers.write_skyrl, compresses=True, fits_itself=True),
    "verl": Format(trainers.write_verl, compresses=True, fits_itself=True),
    "vision": Format(vision.write,
                     needs=("datasets", "--format=vision describes its images with datasets: pip install -e '.[export]'")),
}


def export(run_dirs: Path | list[Path], fmt: str, output: Path, filters: Filters,
           on_problem: Callable[[str, str], None] | None = None, curation: Curation | None = None,
           compression: Compression | None = None, images: ImageOptions | None = None,
           cleaner: Cleaner | None = None) -> Report:
    """Write the kept trajectories of the run (or runs, in turn) that pass `filters`, `curation` and
    `cleaner` to `output` as `fmt`, and the dataset card beside it; what was written, and what was
    left out and why. A dry run (the cleaner's) reads everything and writes nothing."""
    form = FORMATS.get(fmt)
    if form is None:
        raise ExportError(f"unknown --format={fmt!r}; choose one of: {', '.join(FORMATS)}")
    curation = curation or Curation(pairs=form.pairs)
    if compression is not None and not form.compresses:
        raise ExportError(f"--max_tokens compresses {', '.join(f for f, x in FORMATS.items() if x.compresses)} rows, "
                          f"not {fmt}")
    if curation.pairs and curation.keep != "all":
        raise ExportError("--keep picks samples to write one by one; --format=preference writes pairs: use one of them")
    suffix = output.suffix.lower()
    if form.per_trajectory and suffix:
        raise ExportError(f"--format={fmt} writes one file per trajectory: give --output a directory")
    if form.needs is not None:
        module, install = form.needs
        try:
            __import__(module)
        except ImportError as exc:
            raise ExportError(install) from exc
    if suffix not in ("", ".jsonl", ".parquet"):
        raise ExportError(f"--output={output}: use a .jsonl or .parquet file, or a directory for a datasets dataset")
    rows = Rows(run_dirs, filters, curation, compression, on_problem, fits_itself=form.fits_itself, cleaner=cleaner)
    rows.images = images
    if rows.cleaner.cleaning.dry_run:
        for _ in (preference.pair_rows(rows) if form.pairs else rows):
            pass
        return rows.report
    form.write(rows, output)
    rows.report.card = write_card(output, fmt, written_rows(output, rows.report.written),
                                  rows.report.sources, rows.report.cleaning,
                                  [d.name for d in rows.run_dirs], form.pairs)
    return rows.report


def written_rows(output: Path, trajectories: int) -> int:
    """How many rows `output` holds (token formats write a row per segment, trainers' per prompt)."""
    if output.is_dir():
        if (output / "dataset_info.json").exists():
            import datasets

            return int(datasets.load_from_disk(str(output)).num_rows)
        return sum(1 for p in output.iterdir() if p.suffix in (".json", ".jsonl"))
    if output.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(output).metadata.num_rows)
    if output.suffix.lower() == ".jsonl":
        with open(output, "rb") as f:
            return sum(1 for line in f if line.strip())
    return trajectories
