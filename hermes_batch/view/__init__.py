"""What a person looks at: a run's HTML report (`write_report`) and two runs side by side (`compare`)."""

from .compare import compare_runs, summary_lines, write_page
from .report import ViewOptions, write_report

__all__ = [
    "ViewOptions",
    "compare_runs",
    "summary_lines",
    "write_page",
    "write_report",
]
