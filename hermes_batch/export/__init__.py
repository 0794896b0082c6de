"""A run's trajectories out, for trainers: `export` writes one of FORMATS (openai, sharegpt, sts,
preference, atif: a module each), from rows checked to train as they read (`rows`), curated by
verdict and sample (`curate`), compressed in the middle to a token budget (`compress`), and uploaded
to the Hub (`push_to_hub`)."""

from .compress import compression_for
from .files import push_to_hub
from .options import ExportError, ExportOptions, Filters
from .rows import kept_records
from .writer import FORMATS, export

__all__ = [
    "FORMATS",
    "ExportError",
    "ExportOptions",
    "Filters",
    "compression_for",
    "export",
    "kept_records",
    "push_to_hub",
]
