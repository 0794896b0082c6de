"""The run: the spine that plans the work, feeds executors (a local process pool or Ray) and settles each
outcome once (`run`), the worker processes that run episodes, and the commands that re-score a run
(`recheck` in fresh sandboxes, `rejudge` for the judge's verdicts) or check a dataset's checks (`validate`)."""

from .spine import RunResult, run

__all__ = [
    "RunResult",
    "run",
]
