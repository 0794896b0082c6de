"""The work an invocation owes: which prompts of the dataset still need a run, each with its
toolsets drawn (seeded by its id, so a retry sees the same ones) and its attempt counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import distributions
from .config import RunConfig
from .dataset import Dataset, PromptRecord
from .sampling import sample_toolsets
from .store import RunState
from .tools import TOOLSETS
from .wire import WorkItem


@dataclass
class Plan:
    items: list[WorkItem]
    skipped_done: int
    skipped_discarded: int
    retried: int
    gave_up: int = 0  # failed --max_attempts times: not retried


def plan_work(config: RunConfig, dataset: Dataset, state: RunState) -> Plan:
    dist = None if config.toolsets else distributions.get(config.distribution, set(TOOLSETS))
    unavailable = frozenset() if config.has_web_provider else frozenset({"web"})
    owed, done, discarded, retried, gave_up = [], 0, 0, 0, 0
    for index, pid in enumerate(dataset.ids):
        if pid in state.done:
            done += 1
            continue
        if pid in state.discarded:
            discarded += 1
            continue
        if pid in state.failed and state.attempts.get(pid, 0) >= config.max_attempts:
            gave_up += 1  # it would most likely fail again and spend again
            continue
        retried += pid in state.failed
        owed.append(index)
    items = [_item(config, rec, dist, unavailable, state.attempts.get(rec.id, 0) + 1)
             for rec in dataset.records_at(owed)]  # only the rows still owed are read again
    return Plan(items, done, discarded, retried, gave_up)


def _item(config: RunConfig, rec: PromptRecord, dist: Any, unavailable: frozenset[str], attempt: int) -> WorkItem:
    toolsets = list(config.toolsets) if config.toolsets else sample_toolsets(rec.id, dist, unavailable)
    task = rec.task
    return WorkItem(
        id=rec.id, index=rec.index, prompt=rec.prompt, toolsets=toolsets,
        batch_num=rec.index // config.batch_size, image=rec.image or (task.image if task else None),
        cwd=rec.cwd or (task.cwd if task else None), extra=rec.extra, attempt=attempt, task=task,
        build=task.environment if task else None,
    )
