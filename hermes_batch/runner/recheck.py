"""`python batch_runner.py recheck --run_name=NAME [--dataset_file=FIXED.jsonl]`: score a finished
run again with the checks its dataset has now, without running any agent or asking any model.

A row's id leaves its checks out (dataset/rows.py), so a row whose check was fixed is the same row.
For each kept trajectory of a row with checks:

    command check   a fresh sandbox: the row's files and setup, then the trajectory's saved work
                    tree (--save_workspace) put back, then the check as in a run
    expected        the record's final answer against the row's expected values, as in a run
    rubric          the judge's grade is kept when the checks are the ones it was given with (a
                    judge is a model: `recheck` asks none); a rubric new or changed since makes
                    the verdict an error, which `--resume` then asks the judge about

The new verdict, stamped with the checks' version, goes to verdicts.jsonl, which merge, export,
the statistics and the viewer read over the record. A trajectory whose command check needs a
work tree the run did not save keeps its verdict, and is counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from ..backends import Sandbox
from ..checks import CheckResult, check_answer, verdict
from ..config import RunConfig
from ..dataset import Dataset
from ..episode import checked_afresh, sandbox_spec
from ..record import index_of_samples
from ..store import RunState, RunStore, file_name, is_file_name, put_back
from ..util import parse_size
from .rejudge import run_of
from .sandboxes import open_backend, set_up

AT_ONCE = 8  # sandboxes at once, unless --max_sandboxes says otherwise


async def recheck(config: RunConfig, store: RunStore, state: RunState, dataset: Dataset) -> Counter:
    """Check every kept trajectory of a checked row again; how it went, by outcome."""
    index_of = index_of_samples(dataset.ids, config.samples, state.done)
    rows = {r.index: r for r in dataset.records}
    counts: Counter = Counter()
    backend = open_backend(config)
    shut_down = await set_up(backend, config)
    at_once = config.max_sandboxes or AT_ONCE
    gate = asyncio.Semaphore(at_once)

    async def one(rec: dict[str, Any]) -> None:
        index = index_of.get(rec["id"])
        row = rows.get(index) if index is not None else None
        if row is None or row.task is None or not row.task.checked:
            counts["no_check"] += 1
            return
        task = row.task
        old = rec.get("verification") or {}
        checks: list[CheckResult] = []
        if task.check:
            archive = read_workspace(store, rec, parse_size(config.workspace_limit))
            if archive is None:
                counts["no_workspace"] += 1
                return
            spec = sandbox_spec(f"{rec['id']}-recheck", row.sandbox_image, row.sandbox_cwd, task, config)

            async def restore(box: Sandbox, _: float, archive: bytes = archive) -> None:
                await put_back(box, archive)

            checks.append(await checked_afresh(backend, gate, spec, task, config, restore))
        if task.expected is not None:
            checks.append(check_answer(task, run_of(rec).final_answer))
        if task.rubric:
            kept = [CheckResult(**c) for c in old.get("checks") or [] if c.get("kind") == "judge"]
            if kept and old.get("check_version") == task.version:
                checks.extend(kept)
                counts["judge_kept"] += 1
            else:  # a rubric new or changed since: the judge's, on --resume (rejudge.py)
                checks.append(CheckResult("judge", "error", error="the rubric is new or changed since this trajectory "
                                                                   "was graded: --resume asks the judge"))
                counts["judge_owed"] += 1
        new = verdict(checks, config.pass_score)
        new.check_version = task.version
        store.add_verdict(rec["id"], new.to_json())
        counts["changed" if new.status != old.get("status") else "same"] += 1

    records = store.kept_records()  # one shared stream: each record read once, by one of the checkers

    async def checker() -> None:
        for rec in records:
            await one(rec)

    try:
        await asyncio.gather(*(checker() for _ in range(at_once)))
    finally:
        await backend.sweep_orphans()
        await shut_down()
    return counts


def stale(state: RunState, store: RunStore, dataset: Dataset, samples: int) -> list[str]:
    """The kept trajectories whose latest verdict came from other checks than their rows have now
    (a check, expected or rubric edited since)."""
    if not state.check_versions:
        return []
    index_of = index_of_samples(dataset.ids, samples, state.done)
    now = {r.index: r.task.version for r in dataset.records if r.task is not None and r.task.checked}
    out = []
    for sid, version in state.check_versions.items():
        latest = (store.verdicts.get(sid) or {}).get("check_version") or version
        index = index_of.get(sid)
        if index in now and now[index] != latest:
            out.append(sid)
    return out


def read_workspace(store: RunStore, rec: dict[str, Any], limit: int) -> bytes | None:
    """The work tree the run saved for this record (only where the run keeps them, at most `limit`
    bytes: the record's own words are not trusted for a path)."""
    if not isinstance(((rec.get("metadata") or {}).get("workspace") or {}).get("file"), str):
        return None
    if not is_file_name(rec.get("id")):
        return None
    path = store.dir / file_name(rec["id"])
    try:
        if path.stat().st_size > limit:
            return None
        return path.read_bytes()
    except OSError:
        return None


def summary(counts: Counter) -> str:
    parts = [f"{counts['changed']} verdict(s) changed, {counts['same']} the same"]
    if counts["no_workspace"]:
        parts.append(f"{counts['no_workspace']} kept their verdict: their check runs on the work tree, which the run "
                     "did not save (--save_workspace)")
    if counts["judge_kept"]:
        parts.append(f"{counts['judge_kept']} kept their judge's grade (a judge is a model: not asked again)")
    if counts["judge_owed"]:
        parts.append(f"{counts['judge_owed']} have a rubric new or changed since: their verdict is an error until "
                     "--resume asks the judge")
    if counts["no_check"]:
        parts.append(f"{counts['no_check']} have no check now")
    return "; ".join(parts)
