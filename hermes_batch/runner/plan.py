"""The work an invocation owes: which samples of which prompts of the dataset still need a run,
each with its toolsets drawn (seeded by the prompt's id, so a retry and every sample see the same
ones) and its attempt counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import distributions
from ..config import RunConfig
from ..dataset import Dataset, PromptRecord
from ..episode import WorkItem
from ..record import each_sample, sample_id
from ..store import RunState
from .sampling import sample_toolsets


@dataclass
class Plan:
    items: list[WorkItem]
    skipped_done: int
    skipped_discarded: int
    retried: int
    gave_up: int = 0  # failed --max_attempts times: not retried


def plan_work(config: RunConfig, dataset: Dataset, state: RunState) -> Plan:
    dist = None if config.toolsets else distributions.get(config.distribution, set(config.plugins()))
    unavailable = frozenset(config.toolsets_left_out)
    owed: dict[int, list[int]] = {}  # dataset index → its samples still owed
    done, discarded, retried, gave_up = 0, 0, 0, 0
    for index, sample, sid in each_sample(dataset.ids, config.samples):
        if sid in state.done:
            done += 1
            continue
        if sid in state.discarded:
            discarded += 1
            continue
        if sid in state.failed and state.attempts.get(sid, 0) >= config.max_attempts:
            gave_up += 1  # it would most likely fail again and spend again
            continue
        retried += sid in state.failed
        owed.setdefault(index, []).append(sample)
    items = [work_item(config, rec, sample, dist, unavailable, state)
             for rec in dataset.records_at(owed) for sample in owed[rec.index]]  # only the rows still owed are read again
    return Plan(items, done, discarded, retried, gave_up)


def work_item(config: RunConfig, rec: PromptRecord, sample: int, dist: Any, unavailable: frozenset[str],
              state: RunState) -> WorkItem:
    """One sample of a row to run; `dist`: the run's distribution (None with --toolsets)."""
    # drawn by the prompt's id: every sample of a prompt is offered the same tools
    toolsets = list(config.toolsets) if config.toolsets else sample_toolsets(rec.id, dist, unavailable)
    toolsets += [name for name in config.always_offered() if name not in unavailable]
    task = rec.task
    sid = sample_id(rec.id, sample)
    return WorkItem(
        id=sid, index=rec.index, prompt=rec.prompt, toolsets=toolsets,
        batch_num=rec.index // config.batch_size, image=rec.sandbox_image,
        cwd=rec.sandbox_cwd, extra=rec.extra, attempt=state.attempts.get(sid, 0) + 1,
        task=task, build=task.environment if task else None, prompt_id=rec.id, sample=sample,
        samples=config.samples,
    )
