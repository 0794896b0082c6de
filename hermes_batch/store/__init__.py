"""A run's directory: batch files, the merged trajectories.jsonl, the ledger that makes resume exact,
checkpoint and statistics (`RunStore`, `RunState`), and saved work trees (`workspace`). Every write is
crash-safe; nothing here knows how a trajectory was made."""

from .ledger import DISCARDED, FAILED, LedgerEntry
from .run_store import DATASET_INDEX, LEDGER, RunLocation, RunState, RunStore, disk_full, run_name_checked
from .workspace import file_name, is_file_name, put_back

__all__ = [
    "DATASET_INDEX",
    "DISCARDED",
    "FAILED",
    "LEDGER",
    "LedgerEntry",
    "RunLocation",
    "RunState",
    "RunStore",
    "disk_full",
    "file_name",
    "is_file_name",
    "put_back",
    "run_name_checked",
]
