"""Whether a trajectory is right: the checks a task carries (checks/task.py), each giving a `CheckResult`,
and the verdict they add up to (docs/verification.md).

A check's status is `pass`, `fail` or `error`. An error means the runner could not judge for a
reason outside the agent's reach (its sandbox was lost, a judge could not be reached): it is never
counted as a fail, and `--check_retries` runs it again. Whatever the agent left is judged: a check
that cannot run on it (timed out, its command not found, no place for its files) fails, the reason
kept. The verdict is `fail` if any check failed, else
`error` if any could not say, else `pass`; `skipped` when the row has no check at all.
"""

from __future__ import annotations

import json
import math
import posixpath
import shlex
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..backends import SandboxError
from ..backends.base import MAX_INLINE_CODE, Sandbox, SandboxExhausted, whole_output
from ..util import clip
from .answers import REGEX_SECONDS, matches, pick_answer
from .task import Task

Status = Literal["pass", "fail", "error"]
OUTPUT_KEPT = 4000  # characters of a check's stdout and of its stderr kept in the record (head and tail)
RESULT_FILE_BYTES = 1024 * 1024  # the most read of one result file
HARBOR_RESULT_DIR = "/logs/verifier"  # where Harbor's tests/test.sh writes reward.txt|reward.json


@dataclass(slots=True)
class CheckResult:
    """One check's outcome. Every key is present in every record (null when it does not apply),
    so the records load as one table."""

    kind: Literal["command", "answer", "judge"]
    status: Status
    score: float | None = None
    seconds: float = 0.0
    error: str | None = None  # why the check could not say (status error), or why it failed
    exit_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    rewards: dict[str, float] | None = None  # a reward.json of several values
    tests: dict[str, Any] | None = None  # per-test results from JUnit XML or CTRF JSON
    answer: str | None = None
    expected: list[str] | None = None
    match: str | None = None
    explanation: str | None = None  # the judge's
    model: str | None = None  # the judge's
    usage: dict[str, Any] | None = None  # the judge's tokens and cost
    attempts: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Verdict:
    status: Literal["pass", "fail", "error", "skipped"]
    score: float | None
    pass_score: float
    checks: list[CheckResult] = field(default_factory=list)
    baseline: CheckResult | None = None  # the check on the untouched starting state (--check_baseline)
    check_version: str | None = None  # Task.version of the checks that gave it

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.checks)

    @property
    def error_kinds(self) -> list[str]:
        return [c.kind for c in self.checks if c.status == "error"]

    def to_json(self) -> dict[str, Any]:
        baseline = self.baseline
        return {"status": self.status, "score": self.score, "pass_score": self.pass_score,
                "check_version": self.check_version,
                "seconds": round(self.seconds, 3), "checks": [c.to_json() for c in self.checks],
                # a check that passes before the agent did anything cannot tell right from wrong
                "baseline": {"status": baseline.status, "score": baseline.score, "error": baseline.error,
                             "seconds": baseline.seconds} if baseline else None}


def verdict(checks: list[CheckResult], pass_score: float) -> Verdict:
    if not checks:
        return Verdict("skipped", None, pass_score)
    statuses = {c.status for c in checks}
    status: Status = "fail" if "fail" in statuses else "error" if "error" in statuses else "pass"
    scores = [c.score for c in checks if c.score is not None]
    score = min(scores) if scores and status != "error" else None
    return Verdict(status, score, pass_score, checks)


def scored(score: float, pass_score: float) -> Status:
    return "pass" if score >= pass_score else "fail"


# --- the final answer against `expected` ------------------------------------------------------
def check_answer(task: Task, final: str | None) -> CheckResult:
    """`expected` against the agent's final answer: pass if any expected value matches."""
    assert task.expected is not None
    t0 = time.monotonic()
    shown = [_shown(v) for v in task.expected]
    result = CheckResult("answer", "fail", 0.0, expected=shown, match=task.match)
    if final is None:
        result.error = "the agent gave no final answer"
    else:
        try:
            answer = pick_answer(final, task.answer_regex)
            result.answer = clip(answer if answer is not None else final, OUTPUT_KEPT)
            if answer is None:
                result.error = f"answer_regex {task.answer_regex!r} found nothing in the final answer"
            elif any(matches(answer, e, task.match, task.tolerance) for e in task.expected):
                result.status, result.score = "pass", 1.0
        except TimeoutError:  # on the agent's words: a fail, never an error it could choose
            result.error = f"a regular expression of the row took more than {REGEX_SECONDS:g} s on this answer"
    result.seconds = round(time.monotonic() - t0, 3)
    return result


def _shown(value: str | int | float) -> str:
    return str(value)


# --- a check command in the prompt's sandbox ---------------------------------------------------
class FilesNotWritten(SandboxError):
    """The sandbox answered, but a task's file could not be written where it goes."""


class CheckCannotRun(Exception):
    """What the agent left gives the check no way to run (no place for its files, say): a fail."""


PREPARE_PART = 60_000  # bytes of one part of the preparation: each is short enough to run inline (no file)


def _prepare_scripts(sandbox: Sandbox, task: Task) -> list[str]:
    """POSIX sh, the runner's, once the agent's processes are gone, run from /: make fresh what the
    check uses and the agent could have planted or blocked (its own home, temporary, bytecode and
    result directories; Harbor's /logs/verifier; the directories its absolute check files go to,
    emptied; whatever stands where a check file goes; a work directory or /tmp it made unusable).
    Every directory a check file goes to is a new one (its agent's files moved in), writable by its
    owner alone: a descriptor of the old one, kept by anything, reaches no file of the check's.
    The first part prints the new directory; each exits 3 saying why it cannot. Nothing is sent to
    /dev/null (`2>&-`): the agent may have made it unusable."""
    q = shlex.quote

    def no(why: str) -> str:
        return f"{{ printf '%s\\n' {q(why)} >&2; exit 3; }}"

    own_root = getattr(sandbox, "own_root", False)
    tmp = getattr(sandbox, "check_parent", "/tmp")
    first = [f"set -u; w={q(sandbox.workdir)}; t={q(tmp)}",
             # a /tmp or work directory the agent made unusable is given back (where it owns them)
             '{ [ -w "$t" ] && [ -x "$t" ]; } || chmod u+rwx "$t" 2>&-',
             '[ -d "$w" ] && ! [ -L "$w" ] && { { [ -w "$w" ] && [ -x "$w" ]; } || chmod u+rwx "$w" 2>&-; }',
             f'd=$(mktemp -d "$t/hermes-check-XXXXXXXX") || {no(f"cannot make a directory for the check in {tmp}")}',
             f'mkdir "$d/home" "$d/tmp" "$d/result" "$d/pycache" || {no(f"cannot make the checks directories in {tmp}")}']
    pristine = getattr(sandbox, "pristine_home", None)
    if pristine:  # its HOME: the image's own, as the image has it (read-only there), never the agent's
        # (what cannot be copied is left out: a partial copy can only make the check fail)
        first.append(f'cp -RPp {q(pristine)}/. "$d/home"/ 2>&- || true')
    if own_root:
        first.append(f'{{ [ -w /logs ] && [ -x /logs ]; }} 2>&- || chmod u+rwx /logs 2>&-; '
                     f'chmod -R u+rwx {HARBOR_RESULT_DIR} 2>&-; rm -rf {HARBOR_RESULT_DIR}; '
                     f'mkdir -p /logs && mkdir -m 700 {HARBOR_RESULT_DIR} || {no(f"cannot make {HARBOR_RESULT_DIR} afresh")}')
    first.append('printf %s "$d"')
    clearing = []
    for root in sorted({"/" + p.split("/")[1] for p in task.check_files if p.startswith("/")}):
        r = q(root)  # e.g. Harbor's /tests: only the task's own files there, none of the agent's
        clearing.append(f'chmod -R u+rwx {r} 2>&-; rm -rf {r}/* {r}/.[!.]* {r}/..?* 2>&-; '
                        f'if [ -L {r} ] || {{ [ -e {r} ] && [ ! -d {r} ]; }}; then rm -rf {r}; fi; '
                        # a new directory where it is not a mount point (a descriptor of the old reaches nothing)
                        f'rmdir {r} 2>&-; mkdir -p {r} && chmod 755 {r} && '
                        f'[ -z "$(ls -A {r})" ] || {no(f"cannot empty {root} for the check files")}')
    relative = sorted(p for p in task.check_files if not p.startswith("/"))
    parents = sorted({posixpath.join(sandbox.workdir, *path.split("/")[:i])
                      for path in relative for i in range(1, len(path.split("/")))}, key=lambda d: d.count("/"))
    for parent in parents:  # outermost first: each made afresh inside one already made afresh
        d = q(parent)
        # a new directory in its place, the agent's files moved into it: a descriptor of the old one that
        # something kept (another prompt's process, handed it) reaches nothing of the check's
        clearing.append(f'if [ -L {d} ] || {{ [ -e {d} ] && [ ! -d {d} ]; }}; then rm -rf {d}; fi; '
                        f'if [ -d {d} ]; then chmod u+rwx {d} 2>&-; '
                        f'n=$(mktemp -d {d}.hb-XXXXXXXX) || {no(f"cannot make {parent} afresh for the check")}; '
                        # (a directory moves to another only with its owner's write right on it)
                        f'find {d} -mindepth 1 -maxdepth 1 -type d -exec chmod u+rwx {{}} + 2>&-; '
                        f'find {d} -mindepth 1 -maxdepth 1 -exec sh -c \'mv -f -- "$@" "$0"/\' "$n" {{}} + 2>&-; '
                        f'for e in {d}/* {d}/.[!.]* {d}/..?*; do {{ [ -e "$e" ] || [ -L "$e" ]; }} || continue; '
                        f'[ -d "$e" ] && ! [ -L "$e" ] && chmod u+rwx "$e" 2>&-; mv -f -- "$e" "$n"/; done; rmdir {d} && mv -- "$n" {d} || {no(f"cannot make {parent} afresh for the check")}; fi; '
                        f'[ -d {d} ] && chmod 755 {d}')
    for path in relative:
        at = q(posixpath.join(sandbox.workdir, path))
        clearing.append(f'chmod -R u+rwx {at} 2>&-; rm -rf {at}; '
                        f'if [ -e {at} ] || [ -L {at} ]; then {no(f"cannot clear {path} for the check")}; fi')
    # bytecode beside a check file would be run in its place (`python3 -I` ignores PYTHONPYCACHEPREFIX)
    for where in sorted({posixpath.dirname(posixpath.join(sandbox.workdir, p)) for p in task.check_files}):
        clearing.append(f'chmod -R u+rwx {q(where)}/__pycache__ 2>&-; rm -rf {q(where)}/__pycache__')
    parts_out, part = ["\n".join(first)], ["set -u"]
    for line in clearing:  # in parts: a script too long for one argv string would need a file in /tmp
        if sum(len(x) + 1 for x in part) + len(line) > PREPARE_PART:
            parts_out.append("\n".join(part))
            part = ["set -u"]
        part.append(line)
    if len(part) > 1:
        parts_out.append("\n".join(part))
    return parts_out


async def check_command(sandbox: Sandbox, task: Task, timeout: float, pass_score: float) -> CheckResult:
    """Run the task's check in its sandbox: every process of the agent ended first, fresh places
    for it (`$RESULT_DIR`, its own `HOME`, `TMPDIR` and bytecode cache), `check_files` written,
    then the check, as the runner's command (a trusted shell, PATH and variables; never the
    agent's); what the check started is ended before its results are read. A reward file's score
    wins over the exit code; exit 0 = pass otherwise (Harbor's tests must write one).

    What the agent left can only make it fail: a check that cannot run on its state (no place for
    its files, its command not found, no end within its time, its memory used up) fails with the
    reason kept. Only the sandbox failing is an error."""
    assert task.check is not None
    t0 = time.monotonic()
    result = CheckResult("command", "error")
    own_root = getattr(sandbox, "own_root", False)
    try:
        if not own_root and any(p.startswith("/") for p in task.check_files):
            raise SandboxError("check files at absolute paths need a sandbox with a root of its own "
                               "(docker, singularity, modal), not this host's")
        await sandbox.end_processes()
        base = ""
        for n, script in enumerate(_prepare_scripts(sandbox, task)):
            made = await sandbox.exec(script, language="shell", timeout=60, runner=True, cwd="/")
            if made.timed_out or made.exit_code != 0 or (n == 0 and not made.stdout.startswith("/")):
                how = "it did not finish within 60 s" if made.timed_out else f"exit {made.exit_code}"
                raise CheckCannotRun(f"the check could not be prepared ({how}): "
                                     f"{(made.stderr or made.stdout).strip()[-500:]}")
            base = base or made.stdout.strip()
        result_dir = HARBOR_RESULT_DIR if own_root else f"{base}/result"
        try:
            await write_files(sandbox, task.check_files)
        except FilesNotWritten as exc:  # the sandbox works: what the agent left is in the way
            raise CheckCannotRun(str(exc)) from None
        code = task.check
        if len(code.encode()) > MAX_INLINE_CODE:  # into the check's own directory, not one the agent knows
            await sandbox.write_file(f"{base}/check.sh", code.encode())
            code = f". {shlex.quote(base)}/check.sh"
        res = await sandbox.exec(code, language="shell", timeout=timeout, runner=True,
                                 env={"HOME": f"{base}/home", "TMPDIR": f"{base}/tmp", "PYTHONPYCACHEPREFIX": f"{base}/pycache",
                                      **task.check_env, "RESULT_DIR": result_dir})
        result.exit_code = res.exit_code
        result.stdout, result.stderr = clip(res.stdout, OUTPUT_KEPT), clip(res.stderr, OUTPUT_KEPT)
        if res.timed_out:  # the backend's own reading: a command may exit 124 by itself
            raise CheckCannotRun(f"the check did not finish within {timeout:g} s")
        await sandbox.end_processes()  # a server the check started cannot write its reward afterwards
        await _read_results(sandbox, result_dir, res.exit_code, result, pass_score, harbor=task.harbor_task is not None)
    except CheckCannotRun as exc:
        result.status, result.score, result.error = "fail", 0.0, str(exc)
    except SandboxExhausted as exc:  # what ran in it used its memory up, or kills what starts there
        result.status, result.score, result.error = "fail", 0.0, f"what the agent left spoilt the sandbox: {exc}"
    except SandboxError as exc:
        result.status, result.score = "error", None
        result.error = f"the sandbox failed: {exc}"
    except OSError as exc:  # a file of the check's that what the agent left would not let through
        result.status, result.score, result.error = "fail", 0.0, f"{type(exc).__name__}: {exc}"
    except ValueError as exc:
        result.status, result.score = "error", None
        result.error = f"{type(exc).__name__}: {exc}"
    result.seconds = round(time.monotonic() - t0, 3)
    return result


async def write_files(sandbox: Sandbox, files: dict[str, Any], under: str | None = None) -> None:
    """Write a task's files (relative paths: in the work directory, or `under`), then mark the executable ones."""
    where = {path: posixpath.join(under or sandbox.workdir, path) for path in files}
    for path, f in files.items():
        try:
            await sandbox.write_file(where[path], f.data)
        except (OSError, ValueError) as exc:
            raise FilesNotWritten(f"could not write {path}: {exc}") from exc
    runnable = [shlex.quote(where[p]) for p, f in files.items() if f.executable]
    if runnable:
        res = await sandbox.exec(f"chmod +x -- {' '.join(runnable)}", language="shell", timeout=60, runner=True)
        if res.exit_code != 0:
            raise FilesNotWritten(f"could not mark files executable: {res.stderr.strip()[-500:]}")


async def _read_results(sandbox: Sandbox, result_dir: str, exit_code: int, result: CheckResult,
                        pass_score: float, harbor: bool = False) -> None:
    # a glob, not `ls`: gVisor's `ls` of a mktemp directory fails (EINVAL)
    # whole: a listing lost on its way back would read as no reward file
    listing = await whole_output(lambda script: sandbox.exec(script, language="shell", timeout=60, runner=True),
                                 f'for f in {shlex.quote(result_dir)}/*; do [ -f "$f" ] && printf "%s\\n" "${{f##*/}}"; '
                                 "done; true", "listing the result directory")
    if listing.exit_code != 0:
        raise SandboxError(f"could not list the result directory: {listing.stderr.strip()[-500:]}")
    names = [n for n in listing.stdout.splitlines() if n]

    async def read(name: str) -> str:
        try:
            data = await sandbox.read_file(posixpath.join(result_dir, name), RESULT_FILE_BYTES)
        except OSError as exc:  # the check's own file, made unreadable by what it ran
            raise CheckCannotRun(f"cannot read the check's {name}: {exc}") from None
        return data.decode("utf-8", errors="replace")

    for name in names:  # per-test reports are best effort: one that cannot be read never decides
        parse = junit_tests if name.endswith(".xml") else ctrf_tests if name.endswith(".json") and "ctrf" in name.lower() \
            else None
        if parse is not None:
            try:
                result.tests = merge_tests(result.tests, parse(await read(name)))
            except (ValueError, CheckCannotRun):
                pass
    reward = None
    try:  # as Harbor's verifier reads them (harbor 0.26.0, verifier/verifier.py): reward.json when it exists
        if "reward.json" in names:
            reward, result.rewards = read_reward_json(await read("reward.json"))
        elif "reward.txt" in names:
            reward = read_reward_text(await read("reward.txt"))
    except ValueError as exc:  # what the check wrote may come from the agent's work: it cannot pass so
        raise CheckCannotRun(str(exc)) from None
    if reward is not None:
        result.score = reward
        result.status = scored(reward, pass_score)
    elif harbor:  # Harbor's contract: tests/test.sh writes the reward; none is never a pass
        raise CheckCannotRun(f"tests/test.sh (exit {exit_code}) wrote no reward.txt or reward.json in "
                             f"{HARBOR_RESULT_DIR}: Harbor counts this as the task's error, here it fails")
    elif exit_code in (126, 127):
        raise CheckCannotRun(f"the check's command could not run (exit {exit_code}: " + (
            "not executable)" if exit_code == 126 else "command not found)"))
    else:
        result.status, result.score = ("pass", 1.0) if exit_code == 0 else ("fail", 0.0)


def read_reward_text(text: str) -> float:
    """reward.txt: one number (usually in [0, 1]; Harbor keeps any as written, and so does this)."""
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"reward.txt must hold one number, found {text.strip()[:60]!r}")
    return value


def read_reward_json(text: str) -> tuple[float, dict[str, float] | None]:
    """reward.json: a number, or an object: its `reward` (or `score`) if it has one, else the mean
    of its numeric values (each kept; other values are ignored)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"reward.json is not JSON ({exc.msg})") from None
    if _numeric(data):
        return float(data), None
    if not isinstance(data, dict):
        raise ValueError("reward.json must hold a number or an object")
    values = {str(k): float(v) for k, v in data.items() if _numeric(v)}
    for key in ("reward", "score"):
        if key in data:
            if key not in values:
                raise ValueError(f"reward.json's {key!r} is not a number: {data[key]!r}")
            return values[key], values
    if not values:
        raise ValueError("reward.json holds no number")
    return sum(values.values()) / len(values), values


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def junit_tests(text: str) -> dict[str, Any]:
    """Per-test results of a JUnit XML report (pytest --junitxml, most test runners)."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise ValueError(f"a JUnit report is not XML ({exc})") from None
    cases = []
    for case in root.iter("testcase"):
        name = ".".join(p for p in (case.get("classname"), case.get("name")) if p)
        status, message = "passed", None
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "")[:500] or None
                break
        cases.append({"name": name, "status": status, "message": message})
    return _summary(cases)


def ctrf_tests(text: str) -> dict[str, Any]:
    """Per-test results of a CTRF JSON report (pytest-json-ctrf, as Harbor's tasks write)."""
    try:
        tests = json.loads(text)["results"]["tests"]
        cases = [{"name": str(t["name"]), "status": _ctrf_status(str(t["status"])),
                  "message": (str(t.get("message") or "")[:500] or None)} for t in tests]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"a CTRF report is not in CTRF's shape ({type(exc).__name__}: {exc})") from None
    return _summary(cases)


def _ctrf_status(status: str) -> str:
    return {"passed": "passed", "failed": "failed", "skipped": "skipped", "pending": "skipped"}.get(status, "error")


def _summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    counts = {s: sum(1 for c in cases if c["status"] == s) for s in ("passed", "failed", "error", "skipped")}
    return {"total": len(cases), **counts, "cases": cases[:500]}


def merge_tests(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    return _summary(a["cases"] + b["cases"])
