"""What travels between the run and the processes that run agent loops: typed messages only.

    run → worker    Run(item) | Throttle() | Stop()
    worker → run    Finished(worker, outcome) | RateLimited(worker) | Note(worker, text) | Fatal(worker, message)
                    | Exited(worker)

They cross process boundaries by pickle (multiprocessing queues, Ray), so they stay plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..checks import Task
from ..record import Outcome


@dataclass(slots=True)
class WorkItem:
    """One sample of a prompt to run, with everything a worker needs to run it and to write its record."""

    id: str
    index: int
    prompt: str
    toolsets: list[str]
    batch_num: int
    image: str | None = None
    cwd: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    task: Task | None = None  # its starting state and checks, when the row has them
    build: str | None = None  # a directory whose Dockerfile makes `image` (a Harbor task's environment)
    prompt_id: str = ""  # the row's id; `id` is this sample's (record/samples.py)
    sample: int = 0
    samples: int = 1
    model: str | None = None  # the served model to ask instead of the run's (a rollout's policy version)

    def __post_init__(self) -> None:
        self.prompt_id = self.prompt_id or self.id

    def again(self) -> WorkItem:
        return replace(self, attempt=self.attempt + 1)


# --- run → worker -----------------------------------------------------------------------------
@dataclass(slots=True)
class Run:
    item: WorkItem


@dataclass(slots=True)
class Throttle:
    """Another worker was rate limited: the endpoint's limit is shared, so cut this one's too."""


@dataclass(slots=True)
class Stop:
    pass


# --- worker → run -----------------------------------------------------------------------------
@dataclass(slots=True)
class Finished:
    worker: int
    outcome: Outcome


@dataclass(slots=True)
class RateLimited:
    worker: int


@dataclass(slots=True)
class Note:
    """Something the user should read once (the run says each distinct text once)."""

    worker: int
    text: str


@dataclass(slots=True)
class Fatal:
    """The whole run must stop (a rejected key, a worker that cannot start)."""

    worker: int
    message: str


@dataclass(slots=True)
class Exited:
    worker: int


ToWorker = Run | Throttle | Stop
FromWorker = Finished | RateLimited | Note | Fatal | Exited
