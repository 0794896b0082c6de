"""Rows in: a JSONL dataset (or the rows a Harbor directory stands for) read, checked row by row and
given content ids, with the index `--resume` uses (`load_dataset` → `Dataset` of `PromptRecord`)."""

from .rows import Dataset, DatasetError, PromptRecord, load_dataset, read_source

__all__ = [
    "Dataset",
    "DatasetError",
    "PromptRecord",
    "load_dataset",
    "read_source",
]
