"""The run: the spine that plans the work, feeds executors (a local process pool or Ray) and settles each
outcome once (`run`), the worker processes that run episodes, and the commands that re-score a run
(`recheck` in fresh sandboxes, `rejudge` for the judge's verdicts) or check a dataset's checks (`validate`).
A run fed by requests instead of a plan (the rollout service, rollout/service/) drives the same
`Spine` through a `Feed` of its own."""

from .executor import Executor, warm_up
from .plan import work_item
from .spine import STOP_GRACE, Feed, RunResult, Spine, check_tools, run, sandboxes_ready

__all__ = [
    "STOP_GRACE",
    "Executor",
    "Feed",
    "RunResult",
    "Spine",
    "check_tools",
    "run",
    "sandboxes_ready",
    "warm_up",
    "work_item",
]
