"""One prompt's way, in one sitting: sandbox → setup → agent → check → record (`run_episode`), and the
typed messages it travels in between the run and its workers (`wire`: `WorkItem`, `Finished`, ...)."""

from .run import Host, checked_afresh, opening, prefill_for, run_episode, sandbox_spec, system_prompt_for, time_budget
from .wire import Exited, Fatal, Finished, FromWorker, Note, RateLimited, Run, Stop, Throttle, WorkItem

__all__ = [
    "Exited",
    "Fatal",
    "Finished",
    "FromWorker",
    "Host",
    "Note",
    "RateLimited",
    "Run",
    "Stop",
    "Throttle",
    "WorkItem",
    "checked_afresh",
    "opening",
    "prefill_for",
    "run_episode",
    "sandbox_spec",
    "system_prompt_for",
    "time_budget",
]
