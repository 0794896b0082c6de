"""What a run adds up to: `Statistics` (statistics.json, the console's summary) and pass@k, pass^k,
majority votes and their intervals over a prompt's samples (`passk`)."""

from .passk import interval
from .statistics import Statistics

__all__ = [
    "Statistics",
    "interval",
]
