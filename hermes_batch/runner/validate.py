"""`python batch_runner.py validate --dataset_file=...`: are the dataset's checks right? No model
is asked. Each row with a `check` runs, in fresh sandboxes of the run's backend:

    untouched   its starting state (files, setup), then the check: it must fail, twice
    solved      the same, then its `reference_solution` (Harbor: solution/solve.sh): it must pass, twice

A check that passes untouched cannot tell right from wrong (`trivial`); one that fails after the
solution is `broken`; one whose two runs disagree is `flaky`; one that could not say (timed out,
exit 126/127, its setup failed) is an `error`. Any of them makes the exit code 1. A row without a
reference solution is checked untouched only.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..backends import Backend, Sandbox
from ..checks import CheckResult, Task, write_files
from ..config import RunConfig
from ..dataset import PromptRecord, read_source
from ..episode import checked_afresh, sandbox_spec
from ..errors import EXIT_OK, UserError
from ..util import say
from .sandboxes import open_backend, set_up
from .spine import prepare_images

RUNS = 2  # of each state: a check that disagrees with itself is flaky
SANDBOXES = 8  # at once, unless --max_sandboxes says otherwise (checks are often CPU-bound)
BAD = ("broken", "trivial", "flaky", "error")
MEANING = {
    "ok": "fails untouched, passes after the solution",
    "untested": "fails untouched; no reference solution to pass",
    "trivial": "passes on the untouched task",
    "broken": "fails after the reference solution",
    "flaky": "disagrees with itself",
    "error": "could not say",
}


@dataclass
class Finding:
    row: PromptRecord
    untouched: list[CheckResult] = field(default_factory=list)
    solved: list[CheckResult] = field(default_factory=list)
    verdict: str = "ok"
    note: str = ""
    solution_failed: str = ""  # how the reference solution itself ended, when not with exit 0

    @property
    def name(self) -> str:
        return str(self.row.extra.get("harbor_name") or " ".join(self.row.prompt.split())[:40])


def classify(f: Finding) -> None:
    """The finding's verdict and, when it is not ok, what shows it."""
    untouched = [r.status for r in f.untouched]
    solved = [r.status for r in f.solved]
    errors = [r for r in (*f.untouched, *f.solved) if r.status == "error"]
    if errors:
        f.verdict, f.note = "error", errors[0].error or "the check could not say"
    elif len(set(untouched)) > 1 or len(set(solved)) > 1:
        f.verdict = "flaky"
        f.note = f"untouched: {', '.join(untouched)}" + (f"; solved: {', '.join(solved)}" if solved else "")
    elif "pass" in untouched:
        f.verdict, f.note = "trivial", _said(f.untouched[0])
    elif solved and "fail" in solved:
        f.verdict, f.note = "broken", f.solution_failed or _said(f.solved[0])
    elif f.solution_failed:  # the check passed a solution that did not finish its work
        f.verdict, f.note = "broken", f"{f.solution_failed}, yet the check passed"
    else:
        f.verdict = "ok" if solved else "untested"


def _said(r: CheckResult) -> str:
    shown = (r.stderr or r.stdout or r.error or "").strip().splitlines()
    return f"exit {r.exit_code}" + (f": {shown[-1][:200]}" if shown else "")


async def trial(backend: Backend, gate: asyncio.Semaphore, config: RunConfig, finding: Finding, task: Task,
                solve: bool, n: int) -> CheckResult:
    """One fresh sandbox: the starting state, the solution if `solve`, then the check."""
    row = finding.row
    spec = sandbox_spec(f"validate-{row.id}-{'solved' if solve else 'untouched'}-{n}", row.sandbox_image, row.sandbox_cwd, task, config)

    async def solution(box: Sandbox, timeout: float) -> CheckResult | None:
        assert task.solution is not None
        await write_files(box, task.solution_files)
        done = await box.exec(task.solution, language="shell", timeout=timeout, env=task.solution_env)
        if done.timed_out:
            return CheckResult("command", "error", error=f"the reference solution timed out after {timeout:g} s")
        if done.exit_code != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()
            finding.solution_failed = (f"the reference solution exited {done.exit_code}"
                                       + (f": {tail[-1][:200]}" if tail else ""))
        return None

    return await checked_afresh(backend, gate, spec, task, config, solution if solve else None)



async def validate_rows(config: RunConfig, rows: list[PromptRecord]) -> list[Finding]:
    backend = open_backend(config)
    shut_down = await set_up(backend, config)
    try:
        await backend.sweep_orphans()
        problems = await prepare_images(backend, {(r.sandbox_image or ""):
                                                  (r.task.environment if r.task else None) for r in rows})
        gate = asyncio.Semaphore(config.max_sandboxes or SANDBOXES)

        async def one(row: PromptRecord) -> Finding:
            task = row.task
            assert task is not None
            finding = Finding(row)
            image = row.sandbox_image or ""
            if image in problems:
                finding.untouched = [CheckResult("command", "error", error=f"image unavailable: {problems[image]}")]
            else:
                runs = [trial(backend, gate, config, finding, task, False, n) for n in range(RUNS)]
                if task.solution:
                    runs += [trial(backend, gate, config, finding, task, True, n) for n in range(RUNS)]
                results = await asyncio.gather(*runs)
                finding.untouched, finding.solved = list(results[:RUNS]), list(results[RUNS:])
            classify(finding)
            return finding

        return list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        await backend.sweep_orphans()
        await backend.finish_run()  # the run-wide directories too
        await shut_down()


def validate(config: RunConfig) -> int:
    """Check the checks of `config.dataset_file`; print a table; the exit code."""
    assert config.dataset_file is not None  # configure() requires it
    with tempfile.TemporaryDirectory(prefix="hermes-validate-") as tmp:
        dataset = read_source(config.dataset_file, Path(tmp), config.max_samples)
        rows = [r for r in dataset.records if r.task is not None and r.task.check]
        if not rows:
            raise UserError(f"{dataset.path}: no row has a check to validate ({len(dataset)} rows read)")
        with_solution = sum(1 for r in rows if r.task and r.task.solution)
        say(f"validating the checks of {len(rows)} of {len(dataset)} rows ({with_solution} with a reference "
            f"solution) on {config.backend}: each {RUNS}× untouched, {RUNS}× solved")
        for line in skipped(dataset.records):
            say(line)
        findings = asyncio.run(validate_rows(config, rows))
    print(table(findings, dataset.path))
    counts = Counter(f.verdict for f in findings)
    say(", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    bad = sum(counts[v] for v in BAD)
    if bad:
        say(f"{bad} check(s) cannot be trusted: fix them before a run scores trajectories with them")
        return 1
    return EXIT_OK


def skipped(records: list[PromptRecord]) -> list[str]:
    """Which rows are not validated, and why: only a `check` command runs (an answer compared with
    `expected`, or a judge's grade, has nothing to run before an agent answers)."""
    why: dict[str, list[int]] = {}
    for r in records:
        task = r.task
        if task is not None and task.check:
            continue
        kinds = [k for k, on in (("expected", task and task.expected is not None), ("rubric", task and task.rubric)) if on]
        reason = (f"checked by {' and '.join(kinds)} only: nothing runs before an agent answers" if kinds
                  else "no check: nothing to validate")
        why.setdefault(reason, []).append(r.line)
    return [f"  not validated: line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}: {reason}"
            for reason, lines in why.items()]


def table(findings: list[Finding], path: Path) -> str:
    rows = [("line", "task", "untouched", "solved", "verdict", "why")]
    for f in findings:
        rows.append((str(f.row.line), f.name, ",".join(r.status for r in f.untouched),
                     ",".join(r.status for r in f.solved) or "-", f.verdict,
                     f.note or MEANING[f.verdict]))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5] for r in rows)
