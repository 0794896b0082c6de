"""On `--resume`, kept trajectories whose verdict is `error` are checked again where no sandbox is
needed (a judge that could not be reached): the agent never runs again. The new verdict goes to the
run's verdicts.jsonl (store/run_store.py), which the merge, export and the report read over the record.

A check that ran in the sandbox (`check`) cannot run again once the sandbox is gone: such a
trajectory keeps its error, and the run says how many.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..checks import CheckResult, Task, verdict
from ..config import RunConfig
from ..dataset import Dataset
from ..record import AgentRun, index_of_samples, tool_results
from ..store import RunState, RunStore

AT_ONCE = 16  # judge requests in flight


@dataclass
class Owed:
    prompt_id: str
    prompt: str
    task: Task
    record: dict[str, Any]


def owed(state: RunState, store: RunStore, dataset: Dataset, samples: int) -> list[Owed]:
    """The kept trajectories of this dataset whose latest verdict is `error` (as written, or as a
    later check, `recheck`'s, left it)."""
    later = {pid for pid, v in store.verdicts.items() if v.get("status") == "error" and pid in state.done}
    index_of = index_of_samples(dataset.ids, samples, state.unsure | later)
    unsure = [pid for pid in sorted(state.unsure | later) if pid in index_of
              and (store.verdicts.get(pid) or {"status": "error"}).get("status") == "error"]
    if not unsure:
        return []
    firsts = {at: pid for pid, at in state.done_at.items() if pid in set(unsure)}
    entries = [e for at, e in store.ledger_entries() if at in firsts and e.kind == "d"]
    rows = {r.index: r for r in dataset.records_at(sorted({index_of[sid] for sid in unsure}))}
    out = []
    for e, line in store.read_records(entries):
        rec = json.loads(line)
        store.with_latest_verdict(rec)
        row = rows.get(index_of[e.id])
        if row is not None and row.task is not None:
            out.append(Owed(e.id, row.prompt, row.task, rec))
    return out


async def rejudge(config: RunConfig, api_key: str | None, store: RunStore, items: list[Owed]) -> Counter:
    """Check each again; how it went: `rechecked` (a verdict now), `still_error`, `needs_sandbox`."""
    judge = config.judge(api_key)
    gate = asyncio.Semaphore(AT_ONCE)
    counts: Counter = Counter()

    async def one(item: Owed) -> None:
        old = item.record.get("verification") or {}
        try:
            checks = [CheckResult(**c) for c in old.get("checks") or []]
        except TypeError:  # a record changed by hand
            counts["unreadable"] += 1
            return
        if any(c.status == "error" and c.kind == "command" for c in checks):
            counts["needs_sandbox"] += 1
            return
        async with gate:
            for i, c in enumerate(checks):
                if c.status == "error" and c.kind == "judge" and item.task.rubric:
                    checks[i] = await judge.grade(item.prompt, item.task.rubric, run_of(item.record), config.pass_score)
                    checks[i].attempts = c.attempts + 1
        new = verdict(checks, config.pass_score)
        result = {**new.to_json(), "baseline": old.get("baseline")}
        store.add_verdict(item.prompt_id, result)
        counts["rechecked" if new.status != "error" else "still_error"] += 1

    try:
        await asyncio.gather(*(one(item) for item in items))
    finally:
        await judge.close()
    return counts


def run_of(record: dict[str, Any]) -> AgentRun:
    """What a judge reads of a trajectory, from its record: its turns, final answer, stop reason."""
    run = AgentRun(stop_reason=(record.get("metadata") or {}).get("stop_reason") or "final_answer")
    for turn in record.get("conversations") or []:
        who = turn.get("from")
        if who == "gpt":
            run.transcript.append({"role": "assistant", "content": turn.get("content") or "",
                                   "tool_calls": [{"name": c.get("name"), "arguments": c.get("arguments")}
                                                  for c in turn.get("tool_calls") or []]})
        elif who == "tool":
            run.transcript.extend({"role": "tool", "content": r.get("content") or ""} for r in tool_results(turn))
        elif who == "human":
            run.transcript.append({"role": "user", "content": turn.get("content") or turn.get("value") or ""})
    return run
