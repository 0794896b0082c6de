"""`python batch_runner.py recheck --run_name=NAME [--dataset_file=FIXED.jsonl]`: score a finished
run again with the checks its dataset has now, without running any agent or asking any model.

A row's id leaves its checks out (dataset.py), so a row whose check was fixed is the same row.
For each kept trajectory of a row with checks:

    command check   a fresh sandbox: the row's files and setup, then the trajectory's saved work
                    tree (--save_workspace) put back, then the check as in a run
    expected        the record's final answer against the row's expected values, as in a run
    rubric          the judge's grade is kept (a judge is a model: `recheck` asks none)

The new verdict, stamped with the checks' version, goes to verdicts.jsonl, which merge, export,
the statistics and the viewer read over the record. A trajectory whose command check needs a
work tree the run did not save keeps its verdict, and is counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from .backends import SandboxError, SandboxSpec
from .config import RunConfig, open_backend
from .dataset import Dataset
from .episode import LazySandbox, starting_state
from .reverify import run_of
from .samples import index_of_samples
from .store import RunState, RunStore
from .task import Task
from .verify import CheckResult, check_answer, check_command, verdict
from .workspace import put_back

AT_ONCE = 8  # sandboxes at once, unless --max_sandboxes says otherwise


async def recheck(config: RunConfig, store: RunStore, state: RunState, dataset: Dataset) -> Counter:
    """Check every kept trajectory of a checked row again; how it went, by outcome."""
    index_of = index_of_samples(dataset.ids, config.samples, state.done)
    rows = {r.index: r for r in dataset.records}
    counts: Counter = Counter()
    backend = open_backend(config)
    await backend.setup()
    at_once = config.max_sandboxes or AT_ONCE
    gate = asyncio.Semaphore(at_once)

    async def one(rec: dict[str, Any]) -> None:
        index = index_of.get(rec["id"])
        row = rows.get(index) if index is not None else None
        task = row.task if row is not None else None
        if task is None or not task.checked:
            counts["no_check"] += 1
            return
        old = rec.get("verification") or {}
        checks: list[CheckResult] = []
        if task.check:
            archive = read_workspace(store, rec)
            if archive is None:
                counts["no_workspace"] += 1
                return
            checks.append(await in_sandbox(config, backend, gate, rec["id"], row.image or task.image,
                                           row.cwd or task.cwd, task, archive))
        if task.expected is not None:
            checks.append(check_answer(task, run_of(rec).final_answer))
        if task.rubric:
            kept = [CheckResult(**c) for c in old.get("checks") or [] if c.get("kind") == "judge"]
            checks.extend(kept)
            counts["judge_kept"] += bool(kept)
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
        await backend.shutdown()
    return counts


def read_workspace(store: RunStore, rec: dict[str, Any]) -> bytes | None:
    saved = (rec.get("metadata") or {}).get("workspace") or {}
    name = saved.get("file")
    if not isinstance(name, str) or "/" not in name or ".." in name:
        return None
    try:
        return (store.dir / name).read_bytes()
    except OSError:
        return None


async def in_sandbox(config: RunConfig, backend: Any, gate: asyncio.Semaphore, sample_id: str, image: str | None,
                     cwd: str | None, task: Task, archive: bytes) -> CheckResult:
    timeout = task.check_timeout or config.check_timeout
    sandbox = LazySandbox(backend, SandboxSpec(prompt_id=f"{sample_id}-recheck", image=image, cwd=cwd), gate)
    try:
        problem = await starting_state(sandbox, task, timeout)
        if problem:
            return CheckResult("command", "error", error=problem)
        box = await sandbox.get()
        await put_back(box, archive)
        return await check_command(box, task, timeout, config.pass_score)
    except SandboxError as exc:
        return CheckResult("command", "error", error=f"the sandbox failed: {exc}")
    finally:
        await sandbox.close()


def summary(counts: Counter) -> str:
    parts = [f"{counts['changed']} verdict(s) changed, {counts['same']} the same"]
    if counts["no_workspace"]:
        parts.append(f"{counts['no_workspace']} kept their verdict: their check runs on the work tree, which the run "
                     "did not save (--save_workspace)")
    if counts["judge_kept"]:
        parts.append(f"{counts['judge_kept']} kept their judge's grade (a judge is a model: not asked again)")
    if counts["no_check"]:
        parts.append(f"{counts['no_check']} have no check now")
    return "; ".join(parts)
