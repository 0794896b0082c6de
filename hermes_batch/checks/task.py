"""What a dataset row may ask beyond its prompt: a starting state and a way to tell a right
trajectory from a wrong one (docs/verification.md).

    files, setup           the task's starting state, made in its sandbox before the agent runs
    check, check_files     a shell check run in the same sandbox after the agent stops (exit 0 = pass,
                           or a score in a result file); check_files are written only then
    check_timeout          seconds for `setup` and for `check` (default: --check_timeout)
    expected, match,       the final answer against one or several expected values:
      answer_regex,          exact | contains | regex | number (within `tolerance`)
      tolerance
    rubric                 criteria a model judge grades the trajectory against
    reference_solution     shell that solves the task: `validate` checks the check against it
    harbor_task            a Harbor task directory (harbor.py): its image, tests and timeouts

`read_task` turns them into a `Task` that travels with the prompt to its worker, or says what is
wrong with them (TaskError: the row is then reported and skipped, as any bad row).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import regex

from ..tools.mcp.servers import McpError, McpServer, read_servers
from .answers import read_number

Match = Literal["exact", "contains", "regex", "number"]
MATCHES = ("exact", "contains", "regex", "number")
TASK_KEYS = ("files", "setup", "check", "check_files", "check_timeout", "expected", "match", "answer_regex",
             "tolerance", "rubric", "reference_solution", "harbor_task", "mcp_servers", "agent_home")
# what tells right from wrong, not what the agent is given: left out of a row's id (a fixed check is
# the same row, `recheck` scores its trajectories again) and hashed into the checks' version
CHECK_KEYS = ("check", "check_files", "check_timeout", "expected", "match", "answer_regex", "tolerance", "rubric",
              "reference_solution")
MAX_TASK_BYTES = 64 * 1024 * 1024  # of one row's files and check_files together: they travel to a worker


class TaskError(ValueError):
    """A row's task fields cannot be used; the message names the field."""


@dataclass(slots=True)
class TaskFile:
    data: bytes
    executable: bool = False


@dataclass(slots=True)
class Task:
    files: dict[str, TaskFile] = field(default_factory=dict)
    setup: str | None = None
    check: str | None = None
    check_files: dict[str, TaskFile] = field(default_factory=dict)
    check_timeout: float | None = None
    expected: list[str | int | float] | None = None  # as written: 395 is "395" to exact and contains
    match: Match = "exact"
    answer_regex: str | None = None
    tolerance: float | None = None
    rubric: str | None = None
    check_env: dict[str, str] = field(default_factory=dict)  # variables the check runs with
    environment: str | None = None  # a directory with a Dockerfile: the image is built from it
    image: str | None = None  # the image it names, or the one built from `environment`
    cwd: str | None = None
    agent_timeout: float | None = None  # seconds the agent may take (with --prompt_timeout, the lower)
    harbor_task: str | None = None  # the Harbor task directory it came from
    solution: str | None = None  # shell that solves the task (runner/validate.py); never run in a run
    solution_files: dict[str, TaskFile] = field(default_factory=dict)  # what it needs (Harbor's solution/)
    solution_env: dict[str, str] = field(default_factory=dict)  # variables it runs with (Harbor's [solution.env])
    env: dict[str, str] = field(default_factory=dict)  # variables of every command (Harbor's [environment.env])
    memory: str | None = None  # what the task asks of its sandbox (Harbor's [environment] memory_mb, cpus)
    cpus: float | None = None
    not_applied: list[str] = field(default_factory=list)  # task.toml settings this runner does not apply (said at start)
    mcp_servers: dict[str, McpServer] = field(default_factory=dict)  # the task's own (tools/mcp), started for its prompt
    agent_home: dict[str, TaskFile] = field(default_factory=dict)  # --agent: the harness's state to start from

    @property
    def version(self) -> str:
        """A short hash of what decides a verdict: the record says which checks scored it."""
        digest = hashlib.sha256()
        for part in (self.check, self.check_timeout, self.expected, self.match, self.answer_regex, self.tolerance,
                     self.rubric, sorted(self.check_env.items())):
            digest.update(repr(part).encode() + b"\0")
        for path, f in sorted(self.check_files.items()):
            digest.update(path.encode() + b"\0" + hashlib.sha256(f.data).digest())
        return digest.hexdigest()[:12]

    @property
    def checked(self) -> bool:
        """Whether anything tells a right trajectory from a wrong one."""
        return bool(self.check or self.expected is not None or self.rubric)

    @property
    def needs_sandbox_first(self) -> bool:
        return bool(self.files or self.setup or any(s.stdio for s in self.mcp_servers.values()))


def read_task(row: dict[str, Any], base: Path) -> Task | None:
    """The row's task, or None when it has no task fields. `base`: the dataset's directory, where a
    `files` or `check_files` directory name is looked up."""
    if not any(key in row and row[key] is not None for key in TASK_KEYS):
        return None
    if row.get("harbor_task") is not None:
        return _harbor(row)
    task = Task(
        files=_files(row, "files", base),
        setup=_text(row, "setup"),
        check=_text(row, "check"),
        check_files=_files(row, "check_files", base),
        check_timeout=_positive(row, "check_timeout"),
        rubric=_text(row, "rubric"),
        solution=_text(row, "reference_solution"),
        mcp_servers=_servers(row.get("mcp_servers"), "'mcp_servers'"),
        agent_home=_files(row, "agent_home", base),
    )
    if task.check_files and not task.check:
        raise TaskError("'check_files' are written for a check, but the row has no 'check'")
    if task.solution and not task.check:
        raise TaskError("'reference_solution' is there to test the row's check (validate), but the row has no 'check'")
    size = sum(len(f.data) for f in (*task.files.values(), *task.check_files.values(), *task.agent_home.values()))
    if size > MAX_TASK_BYTES:
        raise TaskError(f"'files', 'check_files' and 'agent_home' hold {size:,} bytes; at most {MAX_TASK_BYTES:,} per row")
    _expected(row, task)
    return task


def _servers(given: Any, where: str) -> dict[str, McpServer]:
    if given is None:
        return {}
    try:
        return read_servers(given, where)
    except McpError as exc:
        raise TaskError(str(exc)) from None


def _harbor(row: dict[str, Any]) -> Task:
    """A Harbor task directory's image, tests (to /tests, after the agent) and timeouts."""
    from . import harbor

    others = [k for k in TASK_KEYS if k != "harbor_task" and row.get(k) is not None]
    if others:
        raise TaskError(f"a 'harbor_task' row takes its checks from the task directory, not {', '.join(others)}")
    where = Path(str(row["harbor_task"]))
    name = where.name
    if not harbor.is_task_dir(where):
        raise TaskError(f"harbor task {name!r}: {where} needs instruction.md and tests/")
    if not (where / "tests" / "test.sh").is_file():
        raise TaskError(f"harbor task {name!r}: no tests/test.sh")
    try:
        config = harbor.read_config(where)
        tests = _read_directory((where / "tests").resolve())
    except (ValueError, TaskError) as exc:
        raise TaskError(f"harbor task {name!r}: {exc}") from None
    refused = harbor.unsupported(where, config)
    if refused:
        raise TaskError(f"harbor task {name!r}: {refused}")
    verifier, agent, env, solving = (config.get(k) or {} for k in ("verifier", "agent", "environment", "solution"))
    try:
        task = Task(check=f"bash {harbor.TESTS_AT}/test.sh", harbor_task=name,
                    check_files={f"{harbor.TESTS_AT}/{p}": f for p, f in tests.items()},
                    check_timeout=float(verifier.get("timeout_sec") or harbor.DEFAULT_VERIFIER_TIMEOUT),
                    check_env=harbor.variables(verifier, "verifier"),
                    agent_timeout=float(agent["timeout_sec"]) if agent.get("timeout_sec") else None,
                    image=env.get("docker_image"), cwd=env.get("workdir"),
                    env=harbor.variables(env, "environment"), solution_env=harbor.variables(solving, "solution"),
                    memory=f"{int(env['memory_mb'])}m" if env.get("memory_mb") else str(env.get("memory") or
                                                                                          harbor.DEFAULT_MEMORY),
                    cpus=float(env["cpus"]) if env.get("cpus") else harbor.DEFAULT_CPUS,
                    not_applied=harbor.not_applied(config),
                    mcp_servers=_servers(env.get("mcp_servers"), "task.toml's [[environment.mcp_servers]]"))
    except (TypeError, ValueError) as exc:
        raise TaskError(f"harbor task {name!r}: task.toml: {exc}") from None
    if (where / "solution" / "solve.sh").is_file():  # Harbor's oracle: solution/ at /solution, then solve.sh
        try:
            solution = _read_directory((where / "solution").resolve())
        except TaskError as exc:
            raise TaskError(f"harbor task {name!r}: {exc}") from None
        task.solution = f"bash {harbor.SOLUTION_AT}/solve.sh"
        task.solution_files = {f"{harbor.SOLUTION_AT}/{p}": f for p, f in solution.items()}
    dockerfile = where / "environment" / "Dockerfile"
    if task.image is None:
        if not dockerfile.is_file():
            raise TaskError(f"harbor task {name!r}: neither environment/Dockerfile nor [environment] docker_image")
        task.environment = str(dockerfile.parent.resolve())
        task.image = f"hermes-batch-env:{_directory_digest(dockerfile.parent.resolve())}"
        # the work directory, unless task.toml names one, is the built image's WORKDIR (docker reads it)
    return task


def source_directories(row: dict[str, Any], base: Path) -> dict[str, str]:
    """The directories a (valid) row's starting state is read from, each with a digest of its files:
    a `files` directory, a Harbor task's environment/. They are part of the row's identity, so an
    edited fixture is a new task, not one already done."""
    names = [f"{key}:{row[key]}" for key in ("files", "agent_home") if isinstance(row.get(key), str)]
    names += [f"environment:{row['harbor_task']}"] if isinstance(row.get("harbor_task"), str) else []
    return directory_digests(names, base)


def directory_digests(names: list[str], base: Path) -> dict[str, str]:
    """Each of `source_directories`' names with the digest of its files now ("" when it is gone)."""
    out = {}
    for name in names:
        kind, _, where = name.partition(":")
        root = ((Path(where) / "environment") if kind == "environment" else (base / where)).resolve()
        out[name] = _directory_digest(root) if root.is_dir() else ""
    return out


@functools.lru_cache(maxsize=64)
def _directory_digest(root: Path) -> str:
    """Names an image built from this directory: the same files, the same image."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_mode & 0o111}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _text(row: dict[str, Any], key: str) -> str | None:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"'{key}' must be a non-empty string, got {_shown(value)}")
    return value


def _positive(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TaskError(f"'{key}' must be a positive number of seconds, got {_shown(value)}")
    return float(value)


def _files(row: dict[str, Any], key: str, base: Path) -> dict[str, TaskFile]:
    """A mapping of path → text, or the name of a directory beside the dataset (its files, with
    their executable bit)."""
    value = row.get(key)
    if value is None:
        return {}
    if isinstance(value, dict):
        out = {}
        for path, content in value.items():
            _check_path(key, path)
            if not isinstance(content, str):
                raise TaskError(f"'{key}' maps {path!r} to {_shown(content)}; a file's content must be a string")
            out[path] = TaskFile(content.encode())
        return out
    if isinstance(value, str) and value.strip():
        return _directory(key, value, base)
    raise TaskError(f"'{key}' must be an object of path → content, or a directory name, got {_shown(value)}")


def _directory(key: str, name: str, base: Path) -> dict[str, TaskFile]:
    root = (base / name).resolve()
    if not root.is_relative_to(base.resolve()):  # a dataset from elsewhere must not copy this machine's files
        raise TaskError(f"'{key}': {name!r} is outside the dataset's directory {base.resolve()}")
    if not root.is_dir():
        raise TaskError(f"'{key}': no directory {name!r} beside the dataset (looked for {root})")
    try:
        return _read_directory(root)
    except TaskError as exc:
        raise TaskError(f"'{key}': directory {name!r} {exc}") from None


@functools.lru_cache(maxsize=16)  # rows often share one directory: read it once
def _read_directory(root: Path) -> dict[str, TaskFile]:
    out, size = {}, 0
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue  # a link could lead anywhere on the runner's machine
        size += path.stat().st_size
        if size > MAX_TASK_BYTES:
            raise TaskError(f"holds more than {MAX_TASK_BYTES:,} bytes")
        out[path.relative_to(root).as_posix()] = TaskFile(path.read_bytes(), bool(path.stat().st_mode & 0o111))
    if not out:
        raise TaskError("holds no files")
    return out


def _check_path(key: str, path: str) -> None:
    if not path or "\0" in path or path.endswith("/") or any(p in ("", ".", "..") for p in path.strip("/").split("/")):
        raise TaskError(f"'{key}': {path!r} is not a file path (no empty parts, no '.' or '..', no trailing '/')")


def _expected(row: dict[str, Any], task: Task) -> None:
    value = row.get("expected")
    for key in ("match", "answer_regex", "tolerance"):
        if row.get(key) is not None and value is None:
            raise TaskError(f"'{key}' applies to 'expected', which the row does not have")
    if value is None:
        return
    values = value if isinstance(value, list) else [value]
    if not values:
        raise TaskError("'expected' is an empty list: no answer could match")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise TaskError(f"'expected' must be a string or number, or a list of them; got {_shown(v)}")
        if isinstance(v, str) and not v.strip():
            raise TaskError("'expected' holds an empty string: every answer would contain it")
    numeric = all(isinstance(v, (int, float)) for v in values)
    match: Match = row.get("match") or ("number" if numeric else "exact")
    if match not in MATCHES:
        raise TaskError(f"'match' must be one of {', '.join(MATCHES)}; got {_shown(match)}")
    if match == "regex":
        for v in values:
            _compile("expected", str(v))
    if match == "number":
        for v in values:
            if read_number(str(v)) is None:
                raise TaskError(f"'expected' {v!r} is not a number, and match is 'number'")
    task.expected = list(values)
    task.match = match
    task.answer_regex = _text(row, "answer_regex")
    if task.answer_regex is not None:
        _compile("answer_regex", task.answer_regex)
    tolerance = row.get("tolerance")
    if tolerance is not None:
        if match != "number":
            raise TaskError("'tolerance' applies to match 'number' only")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0 \
                or not math.isfinite(tolerance):
            raise TaskError(f"'tolerance' must be a number ≥ 0, got {_shown(tolerance)}")
        task.tolerance = float(tolerance)


def _compile(key: str, pattern: str) -> None:
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise TaskError(f"'{key}' {pattern!r} is not a valid regular expression ({exc})") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
