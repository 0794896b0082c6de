"""The sandbox protocol every backend implements, and the shell-based helpers they share.

A backend hands out one `Sandbox` per prompt. A sandbox runs code (`exec`), moves files in and
out, and is closed exactly once. Everything the tools need beyond that (file confinement, the
`session` tool's parallel snippets) is built here on top of `exec`, so a new backend only has to
implement `exec` well.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import os
import posixpath
import re
import secrets
import shlex
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, field_validator

from ..flags import flag
from ..util import head_part, parse_size
from .errors import ImageUnavailable, SandboxError, SandboxExhausted

Language = Literal["shell", "python"]

# Linux refuses a single argv string longer than 128 KiB (MAX_ARG_STRLEN); bigger code goes via a file.
MAX_INLINE_CODE = 100_000  # bytes
DEFAULT_OUTPUT_LIMIT = 256 * 1024  # bytes kept per stream per exec (head + tail)
READ_CHUNK = 96 * 1024  # bytes of a file moved per exec by the shell-based file transfer
END_MARK = "hb-end"  # the last line of a complete output, where an empty one would otherwise be read as an empty file
TIMEOUT_EXIT_CODE = 124  # what coreutils `timeout` reports; every backend reports a timeout this way
KILL_GRACE = 2  # seconds between `timeout`'s TERM and KILL
CONTAINER_WORKDIR = "/workspace"  # a container's work directory when the prompt names none
# A container sandbox's whole environment: nothing of the runner's; a read-only root, so every
# writable path (home, pip installs) is under /tmp.
CONTAINER_ENV = {
    "HOME": "/tmp", "TMPDIR": "/tmp", "PYTHONUNBUFFERED": "1",
    "PIP_TARGET": "/tmp/site-packages", "PYTHONPATH": "/tmp/site-packages",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
}
# Variables that make a program load code first (an empty one loads none)
LOADERS = ("PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV", "ENV", "LD_PRELOAD", "NODE_OPTIONS", "PERL5OPT", "RUBYOPT")
# What the runner's own commands (a check, ending processes, moving files) run with: no variable
# of the agent's that leads into a place the agent writes (its pip installs, a sitecustomize there),
# and the loaders blanked (an image's own, where they lead nowhere the agent writes, are put back:
# ShellSandbox.runner_image_env)
RUNNER_ENV = {**{k: v for k, v in CONTAINER_ENV.items() if k not in ("PIP_TARGET", "PYTHONPATH")},
              **dict.fromkeys(LOADERS, "")}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class SandboxSpec:
    """What one prompt asks of its sandbox."""

    prompt_id: str
    image: str | None = None
    cwd: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the task's own variables, for every command (Harbor's)
    memory: str | None = None  # the task's own limits, above the run's (containers: docker)
    cpus: float | None = None
    # the image's root keeps its capabilities and its ENTRYPOINT runs, as under Harbor (docker)
    image_root: bool = False


DRIVER_MOUNT = "/opt/hermes-batch-browser"  # where a sandbox sees the browser driver, read-only
HARNESS_MOUNT = "/opt/hermes-batch-harness"  # where a sandbox sees the agent harness the run drives (--agent), read-only


class BackendSettings(BaseModel):
    """What every backend is told: the sandbox flags they share (each backend's docstring says which
    it applies) and what the run sets. A backend with flags of its own declares a subclass as its
    `Settings`; a field with a description is a flag, and `--help` prints that description."""

    model_config = ConfigDict(extra="allow")  # fields of the chosen backend's Settings, on the way to it

    run_label: str = "hermes-batch"  # identifies the run on shared infrastructure (labels, dirs)
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    session_parallelism: int = 8  # snippets of one `session` call run at once (non-Flame backends)
    read_only_root: bool = True
    image: str = flag("python:3.12-slim", "container image when a row names none")
    network: bool = flag(False, "give sandboxes a way out: HTTP(S) to public addresses, through the runner's network guard")
    memory: str = flag("1g", "container memory limit")
    cpus: float = flag(1.0, "container CPU limit", gt=0)
    pids_limit: int = flag(256, "processes and threads per sandbox (containers; local as root)", ge=16)
    disk: str = flag("2g", "the most a prompt's files may take, e.g. 512m, 2g (local and singularity as root: a "
                           "filesystem of this size; docker: its /tmp)")
    runtime: str | None = flag(None, "docker: a runtime, e.g. a gVisor runsc runtime; modal: gvisor or vm")
    # the browser driver's directory on this machine (tools/browser/), when the run offers the
    # browser: bound read-only at DRIVER_MOUNT by the backends that can bind a host directory
    driver_dir: str | None = None
    # the installed agent harness's directory on this machine (harness/), when the run drives one:
    # bound read-only at HARNESS_MOUNT by the backends that can bind a host directory
    harness_dir: str | None = None
    image_root: Literal["harbor", "always", "never"] = flag(
        "harbor", "docker: where a root image's root keeps its capabilities and its ENTRYPOINT runs as it, as under "
                  "Harbor (the agent's commands never hold one): harbor (Harbor tasks), always or never")

    @field_validator("image", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        # python-fire turns `--image=3.12` into a float; an image name is always text
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("disk")
    @classmethod
    def _disk(cls, v: str) -> str:
        if parse_size(v, "--disk") < 16 * 1024 * 1024:
            raise ValueError(f"--disk={v} is too small for a prompt's files (16m at least)")
        return v

    @property
    def run_key(self) -> str:
        """A short hash of the run's label, for names with little room (instances, sessions)."""
        return hashlib.sha256(self.run_label.encode()).hexdigest()[:8]

    @classmethod
    def flag_fields(cls) -> dict[str, Any]:
        return {name: f for name, f in cls.model_fields.items() if f.description}

    def flags(self) -> dict[str, Any]:
        """The flags' values, as a user would write them (stored with the run)."""
        return self.model_dump(mode="json", include=set(self.flag_fields()))


class Process:
    """A command running in a sandbox with its standard input and output open to the runner (an MCP
    server over stdio): bytes in through `write`, out through `stdout`; the last of its stderr kept.
    `close` ends it (its process group) and whatever the runner held for it; the sandbox's own end
    ends it too."""

    stdout: asyncio.StreamReader
    STDERR_KEPT = 8192  # bytes of its stderr kept, the last ones (what it said as it failed)

    def __init__(self) -> None:
        self._stderr = BoundedBuffer(self.STDERR_KEPT)

    def write(self, data: bytes) -> None:
        raise NotImplementedError  # pragma: no cover

    async def drain(self) -> None:
        raise NotImplementedError  # pragma: no cover

    async def wait(self) -> int | None:
        """Its exit code once it has ended (None: the sandbox went with it)."""
        raise NotImplementedError  # pragma: no cover

    async def close(self) -> None:
        raise NotImplementedError  # pragma: no cover

    def stderr_tail(self) -> str:
        return decode(self._stderr.getvalue())

    async def keep_stderr(self, stream: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            while chunk := await stream.read(65536):
                self._stderr.feed(chunk)


@runtime_checkable
class Sandbox(Protocol):
    """One prompt's isolated place to run code. `workdir` is absolute and already resolved."""

    workdir: str

    async def exec(
        self,
        code: str,
        *,
        language: Language = "shell",
        timeout: float,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_limit: int | None = None,
        runner: bool = False,
    ) -> ExecResult:
        """Run `code`. `runner`: the runner's own command (a check, ending processes, moving files),
        started by the sandbox's trusted shell and timer with `RUNNER_ENV` and `trusted_path`,
        never through a program or variable the agent could have planted."""
        ...

    async def read_file(self, path: str, max_bytes: int) -> bytes: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def resolve(self, path: str) -> str: ...

    async def run_snippets(self, codes: list[str], *, language: Language, timeout: float) -> list[ExecResult]: ...

    async def end_processes(self) -> None:
        """End every process the prompt started here, background jobs included; its files stay and
        later commands run as before. Raises SandboxError when it cannot be sure they are gone."""
        ...

    async def spawn(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        """`argv` running as the agent's commands run, its stdin and stdout open to the runner (for
        as long as it runs); SandboxError where this sandbox cannot keep a command's stdin open."""
        ...

    async def listen(self, port: int) -> socket.socket:
        """A socket of the runner's listening on `port` of the sandbox's own loopback (an endpoint
        it serves this sandbox alone); SandboxError where the runner cannot reach its network."""
        ...

    def start_notes(self) -> list[str]:
        """What a user should hear of this sandbox's image, once (the episode says it)."""
        ...

    async def close(self) -> None: ...


class Egress(Protocol):
    """The runner's side of a sandbox's way out with --network (the worker's network guard; egress.py)."""

    async def serve(self, listener: socket.socket, sandbox: str) -> Callable[[], Awaitable[None]]:
        """Serve connections made to `listener` (a listening socket inside `sandbox`'s own network);
        the returned call stops serving it and ends what it still has open."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Creates sandboxes. One instance per worker process; `setup`/`shutdown` bracket its use."""

    name: str
    notes: list[str]  # learnt by `setup`: what its sandboxes will not do that a user may expect
    uses_images: bool  # whether a prompt's `image` means anything here (recorded and fingerprinted)
    # a sandbox costs next to nothing to start: start it when a tool first needs it, not in the
    # background of every prompt's first model call (most of which may never use it)
    starts_cheaply: bool
    builds_images: bool  # a row's image can be built from a Dockerfile here (Harbor tasks)
    egress: Egress | None  # --network: the runner's way out, placed in each sandbox's own network

    async def setup(self) -> None: ...

    async def prepare_image(self, image: str | None) -> str | None: ...

    async def build_image(self, context: str, tag: str) -> bool:
        """Build `tag` from the Dockerfile in `context` unless it exists (backends that `builds_images`);
        whether it was built now."""
        ...

    async def start(self, spec: SandboxSpec) -> Sandbox: ...

    async def sweep_orphans(self) -> int: ...

    async def finish_run(self) -> None: ...

    async def shutdown(self) -> None: ...


class BaseBackend:
    """What most backends do for most of the protocol: nothing. A backend overrides what it needs."""

    name = "?"
    uses_images = False
    starts_cheaply = False
    builds_images = False
    Settings: type[BackendSettings] = BackendSettings

    def __init__(self, settings: BackendSettings):
        self.settings = settings
        self.notes: list[str] = []  # what its sandboxes will not do that a user may expect; said at start
        # --network: the runner's way out, served into each sandbox's own network (egress.py); set by
        # the worker before `setup`. Without it a sandbox's network has no way out at all.
        self.egress: Egress | None = None

    @staticmethod
    def enter_worker() -> None:
        """Called first in each worker process, while it has one thread (before this backend is made)."""

    async def setup(self) -> None:
        pass

    async def prepare_image(self, image: str | None) -> str | None:
        return None

    async def build_image(self, context: str, tag: str) -> bool:
        raise ImageUnavailable(f"the {self.name} backend does not build images from a Dockerfile")

    async def start(self, spec: SandboxSpec) -> Sandbox:
        raise NotImplementedError  # pragma: no cover

    async def sweep_orphans(self) -> int:
        return 0

    async def finish_run(self) -> None:
        pass  # nothing shared outlives the prompts' own sandboxes

    async def shutdown(self) -> None:
        pass


class OncePerKey:
    """Runs a coroutine once per key, however many callers ask at once (an image prepared once for
    all the prompts that need it); a failure stays that key's answer."""

    def __init__(self) -> None:
        self._runs: dict[Any, asyncio.Future[Any]] = {}

    async def __call__(self, key: Any, make: Callable[[], Awaitable[Any]]) -> Any:
        if key not in self._runs:
            self._runs[key] = asyncio.ensure_future(make())
        return await asyncio.shield(self._runs[key])


class BoundedBuffer:
    """Collects a stream but keeps only its first and last bytes, so a noisy command cannot exhaust memory."""

    def __init__(self, limit: int):
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        head_room = head_part(self.limit) - len(self.head)
        if head_room > 0:
            self.head += chunk[:head_room]
            chunk = chunk[head_room:]
        if chunk:
            self.tail += chunk
            tail_limit = self.limit - head_part(self.limit)
            if len(self.tail) > tail_limit:
                del self.tail[: len(self.tail) - tail_limit]

    def getvalue(self) -> bytes:
        dropped = self.total - len(self.head) - len(self.tail)
        if dropped <= 0:
            return bytes(self.head + self.tail)
        return bytes(self.head) + f"\n[... {dropped} bytes omitted ...]\n".encode() + bytes(self.tail)


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class SandboxEnvironment:
    """What a sandbox's start-up probe found, before the agent ran anything."""

    shell: str
    timer: str | None
    workdir: str
    setpriv: str | None  # util-linux's, which can take a command's capabilities away (docker)
    trusted_path: str
    untrusted_path: tuple[str, ...]
    # the PYTHONPATH the commands get, less its directories the agent can write (its own pip target
    # among them): the checks' (a sitecustomize or a module of the agent's there would run in them)
    trusted_pythonpath: str = ""
    untrusted_pythonpath: tuple[str, ...] = ()  # of those, the image's (said once)

    @classmethod
    def read(cls, lines: list[str], agent_writable: tuple[str, ...] | None) -> SandboxEnvironment:
        """From the probe's lines: `P` the PATH, `Y` the PYTHONPATH, `D` a directory of either as its
        links resolve, `X` an executable found on PATH (or in the system directories), `W` the
        resolved work directory."""
        workdir = next(line[1:] for line in lines if line.startswith("W/"))
        path = next((line[1:] for line in lines if line.startswith("P")), "")
        pythonpath = next((line[1:] for line in lines if line.startswith("Y")), "")
        resolved = dict(line[1:].split("\t", 1) for line in lines if line.startswith("D/") and "\t" in line)
        programs = dict(line[1:].split("\t", 1) for line in lines if line.startswith("X/") and "\t" in line)
        writable = None if agent_writable is None else (workdir, *agent_writable)

        def reachable(p: str, real: str | None) -> bool:  # the agent can write it, as written or where it leads
            return writable is not None and (under_any(p, writable) or (real is not None and under_any(real, writable)))

        dirs = list(dict.fromkeys(d for d in path.split(":") if d.startswith("/")))
        untrusted = tuple(d for d in dirs if reachable(d, resolved.get(d)))
        trusted = [d for d in dirs if d not in untrusted and d in resolved]  # (one that is not there is left out)
        trusted += [d for d in SYSTEM_PATH.split(":") if d not in trusted and d not in untrusted and d in resolved
                    and not reachable(d, resolved[d])]

        def first(*names: str) -> str | None:
            for d in trusted:  # PATH's order, as the shell would look
                for name in names:
                    exe = posixpath.join(d, name)
                    if exe in programs and not reachable(exe, programs[exe]):
                        return exe
            return None

        entries = list(dict.fromkeys(e for e in pythonpath.split(":") if e))
        # (a relative entry is the work directory's; one that is not there is left out)
        python_trusted = [e for e in entries if e.startswith("/") and e in resolved and not reachable(e, resolved[e])]
        python_untrusted = tuple(e for e in entries if e != CONTAINER_ENV["PIP_TARGET"]
                                 and (not e.startswith("/") or reachable(e, resolved.get(e))))
        return cls(shell=first("bash") or first("sh") or "sh", timer=first("timeout"), workdir=workdir,
                   setpriv=first("setpriv"), trusted_path=":".join(trusted), untrusted_path=untrusted,
                   trusted_pythonpath=":".join(python_trusted), untrusted_pythonpath=python_untrusted)


def under_any(path: str, roots: tuple[str, ...]) -> bool:
    path = posixpath.normpath(path)
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in map(posixpath.normpath, roots))


class ShellSandbox:
    """Implements the file and snippet parts of `Sandbox` with POSIX shell commands run through `exec`.

    Subclasses provide `exec`, `close`, `workdir` and `scratch` (a writable directory for the
    runner's own temporary files, outside `workdir`).
    """

    workdir: str
    scratch: str
    # Where a check makes its own directory: a sandbox whose /tmp is the host's names one of its
    # own, removed with it (a check's directory in the host's /tmp would outlive the prompt).
    check_parent: str = "/tmp"
    keeps_processes: bool = True  # a background process outlives the command that started it
    driver_dir: str | None = None  # where this sandbox sees the browser driver, if it does
    harness_dir: str | None = None  # where this sandbox sees the agent harness (--agent), if it does
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    session_parallelism: int = 8
    shell: str = "sh"  # bash, else sh, by absolute path from a trusted directory (`learn_environment`)
    timer: str | None = None  # coreutils' (or BusyBox's) `timeout`, likewise, where the sandbox has one
    # Where the agent's commands can write, besides the work directory: its mounts. `None`: anywhere
    # (a root of its own that is writable, or the host), so nothing is out of the agent's reach.
    agent_writable: tuple[str, ...] | None = None
    trusted_path: str = SYSTEM_PATH  # PATH of the runner's own commands: the image's, less what the agent writes
    untrusted_path: tuple[str, ...] = ()  # the image's PATH directories the agent can write (left out)
    task_env: dict[str, str] = {}  # SandboxSpec.env: under every command's own variables
    network_env: dict[str, str] = {}  # --network: where its way out is (egress.egress_env), for every command
    image_env: dict[str, str] = {}  # the image's own ENV, where the backend can read it (docker)
    image_home: str | None = None  # the image's own HOME (its ENV's, else its user's in its /etc/passwd: docker)
    home_writable: bool = False  # the agent's commands can write the image's home (a volume over it: docker)
    # the image's home as the image has it, read-only (docker): each check's HOME is a fresh copy of it
    pristine_home: str | None = None
    trusted_pythonpath: str = ""  # see SandboxEnvironment
    untrusted_pythonpath: tuple[str, ...] = ()
    # `end_processes` signals every process it may (`kill -1`): only where that is the sandbox's alone
    own_pid_namespace: bool = False
    # paths outside the work directory are this sandbox's alone (a container's root): a check may
    # use fixed paths such as Harbor's /logs/verifier there
    own_root: bool = False
    # processes of another user than the commands' keep the sandbox up (docker's init and keeper):
    # `end_processes` leaves them be (the commands can neither signal them nor write their memory)
    others_are_keepers: bool = False
    setpriv: str | None = None  # found by `learn_environment` (see SandboxEnvironment)
    # the capability (a bit of /proc/PID/status's CapBnd) only processes the sandbox started hold:
    # `end_processes` leaves them be; the agent's commands and the runner's own go without it (docker)
    started_by_sandbox: int | None = None
    _snippet_counter: int = 0
    _closed: bool = False

    def check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")

    def mark_closed(self) -> bool:
        """True for the first close (the caller tears the sandbox down); later ones do nothing."""
        first, self._closed = not self._closed, True
        return first

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        raise NotImplementedError  # pragma: no cover

    async def close(self) -> None:
        raise NotImplementedError  # pragma: no cover

    async def _sh(self, script: str, timeout: float = 60.0, output_limit: int | None = None) -> ExecResult:
        """The runner's own shell work (files, processes): never through what the agent planted."""
        # from /: a work directory the agent made unenterable cannot stop the runner's own work
        return await self.exec(script, language="shell", timeout=timeout, output_limit=output_limit, runner=True,
                               cwd="/")

    def command_env(self, env: dict[str, str] | None, runner: bool) -> dict[str, str]:
        """The variables a command is given: the agent's, or the runner's own (`RUNNER_ENV`, the
        trusted PATH); `env` goes on top."""
        if not runner:
            return {**CONTAINER_ENV, **self.network_env, **self.agent_image_env(), **self.task_env, **(env or {})}
        return {**RUNNER_ENV, **self.network_env, **self.runner_image_env(), **self.task_env, **(env or {}),
                "PATH": self.trusted_path}

    def agent_image_env(self) -> dict[str, str]:
        """Of the image's own variables, those CONTAINER_ENV and RUNNER_ENV would hide from the agent's
        commands (docker knows them): its HOME, its PYTHONPATH after the agent's pip installs, its
        loaders and pip settings. Its TMPDIR and PIP_TARGET stay the writable /tmp's."""
        own = self.image_env
        out = {k: own[k] for k in (*LOADERS, *CONTAINER_ENV) if k in own and k not in ("HOME", "TMPDIR", "PIP_TARGET")}
        if self.image_home or own.get("HOME"):
            out["HOME"] = self.image_home or own["HOME"]
        if own.get("PYTHONPATH"):
            out["PYTHONPATH"] = f"{CONTAINER_ENV['PIP_TARGET']}:{own['PYTHONPATH']}"
        return out

    def runner_image_env(self) -> dict[str, str]:
        """The image's own loaders for the runner's commands and the checks, where they lead nowhere
        the agent can write: its PYTHONPATH's directories out of the agent's reach (as PATH's are
        chosen), and each other loader whose every path is absolute and out of its reach."""
        out = {k: v for k, v in self.image_env.items() if k in LOADERS and k != "PYTHONPATH" and v
               and not self._leads_to_agent(v)}
        if self.trusted_pythonpath:
            out["PYTHONPATH"] = self.trusted_pythonpath
        return out

    def image_loaders_left_out(self) -> list[str]:
        """The image's loaders (PYTHONPATH aside) the checks go without (said once)."""
        return [k for k, v in self.image_env.items() if k in LOADERS and k != "PYTHONPATH" and v
                and self._leads_to_agent(v)]

    def _leads_to_agent(self, value: str) -> bool:
        """Whether a variable's value names a path the agent could write (a relative one is the work directory's)."""
        if self.agent_writable is None:
            return True
        places = (self.workdir, *self.agent_writable)
        paths = [t for t in re.split(r"[\s:=,;]+", value) if "/" in t]
        return any(not p.startswith("/") or under_any(p, places) for p in paths)

    async def _code_argv(self, code: str, language: Language, shell: str = "bash") -> list[str]:
        """Inline argv for `code`, or (for code too long for one argv string) a file in scratch."""
        if len(code.encode("utf-8", "surrogateescape")) <= MAX_INLINE_CODE:
            return shell_argv(code, language, shell)
        self._snippet_counter += 1
        path = posixpath.join(self.scratch, f"code-{self._snippet_counter}-{time.monotonic_ns()}")
        await self.write_file(path, code.encode())
        return ["python3", path] if language == "python" else [shell, path]

    async def _timed_argv(self, code: str, language: Language, timeout: float,
                          prefix: list[str] | None = None) -> list[str]:
        """argv for `code`, under `timeout` when the sandbox has it: it kills the command's whole
        process group inside the sandbox, which an engine-side deadline alone does not. Both by
        absolute paths the agent cannot write, so its PATH cannot put a program of its own first;
        `prefix` (such a program too) runs first: the one that takes capabilities away."""
        argv = await self._code_argv(code, language, self.shell)
        if self.timer:
            argv = [self.timer, "-k", str(KILL_GRACE), f"{timeout:g}", *argv]
        return [*(prefix or ()), *argv]

    async def learn_environment(self, workdir: str, known: dict[Any, SandboxEnvironment] | None = None,
                                key: Any = None) -> None:
        """One start-up exec, before the agent has run anything: create the work and scratch
        directories, resolve the work directory, read the image's PATH and find bash and `timeout`
        in its directories the agent cannot write. A sandbox that cannot answer this is broken: it
        is closed.

        With `known` (a backend's answers so far, by `key`: the image and work directory), a
        sandbox whose work directory the engine creates skips the exec once its image has answered."""
        if known is not None and key in known:
            self.adopt(known[key])
            return
        q = shlex.quote(workdir)
        script = (
            f"mkdir -p {q} {shlex.quote(self.scratch)} || exit 1; printf 'P%s\\n' \"$PATH\"; "
            "printf 'Y%s\\n' \"${PYTHONPATH:-}\"; "
            # each directory (PATH's, PYTHONPATH's) and program as written and as its links resolve (one
            # could lead into /tmp) (the system directories in a variable: a colon written in the word itself splits nothing)
            f"dirs=\"$PATH:{SYSTEM_PATH}:${{PYTHONPATH:-}}\"; IFS=:; for d in $dirs; do r=$(cd \"$d\" 2>&- && pwd -P) || continue; "
            'printf "D%s\\t%s\\n" "$d" "$r"; for c in bash sh timeout setpriv; do [ -f "$d/$c" ] && [ -x "$d/$c" ] && '
            'printf "X%s\\t%s\\n" "$d/$c" "$(readlink -f "$d/$c" 2>&- || printf %s "$d/$c")"; done; done; unset IFS; '
            f"cd {q} && printf 'W%s\\n' \"$(pwd -P)\"")
        try:
            for wait in (60, 180):  # a busy engine's first exec can take a minute: once more, for longer
                probe = await self.exec(script, language="shell", timeout=wait, cwd="/")  # the work directory may not exist yet
                # an exec that failed saying nothing at all was lost by a loaded engine (seen in CI with
                # Docker at a load of 10 on two cores), not refused by the sandbox: asked once more too
                lost = probe.exit_code != 0 and not probe.stdout.strip() and not probe.stderr.strip()
                if not probe.timed_out and not lost:
                    break
            lines = probe.stdout.splitlines()
            if probe.exit_code != 0 or not any(line.startswith("W/") for line in lines):
                raise SandboxError(f"the sandbox did not answer its start-up probe (a POSIX shell is required; "
                                   f"exit {probe.exit_code}): {probe.stderr.strip() or probe.stdout.strip()}")
        except SandboxError as exc:
            ended = await self.ended_at_start()
            await self.close()
            if ended:
                raise SandboxError(ended) from exc
            raise
        except BaseException:
            await self.close()
            raise
        found = SandboxEnvironment.read(lines, self.agent_writable)
        self.adopt(found)
        if known is not None:
            known[key] = found

    async def ended_at_start(self) -> str | None:
        """Why the sandbox ended by itself before its first command (a container whose entrypoint
        failed), or None: said instead of a start-up probe that could not be answered."""
        return None

    def start_notes(self) -> list[str]:
        said = []
        if self.untrusted_path:
            said.append(f"its PATH holds {', '.join(self.untrusted_path)}, which the agent's commands can write; checks "
                        "and the runner's own commands run without it")
        if self.untrusted_pythonpath:
            said.append(f"its PYTHONPATH holds {', '.join(self.untrusted_pythonpath)}, which the agent's commands can "
                        "write; checks run without it (a check that imports from there can `cd` there)")
        if left := self.image_loaders_left_out():
            said.append(f"its {', '.join(left)} names a place the agent's commands can write; checks run without it")
        return said

    def adopt(self, found: SandboxEnvironment) -> None:
        self.shell, self.timer, self.workdir, self.setpriv = found.shell, found.timer, found.workdir, found.setpriv
        self.trusted_path, self.untrusted_path = found.trusted_path, found.untrusted_path
        self.trusted_pythonpath, self.untrusted_pythonpath = found.trusted_pythonpath, found.untrusted_pythonpath

    async def listen(self, port: int) -> socket.socket:
        """A socket listening on `port` of the sandbox's own loopback, the runner's (an endpoint it
        serves this sandbox alone: egress.py); SandboxError where its network is not this machine's."""
        pid = await self.network_pid()
        if pid is None:
            raise SandboxError(f"the {type(self).__name__.removesuffix('Sandbox').lower()} backend's sandboxes have no "
                               "network of this machine's to serve them in")
        from .egress import listener_inside

        return await listener_inside(pid, port)

    async def network_pid(self) -> int | None:
        """A process of this machine in the sandbox's own network (None: none the runner can join)."""
        return None

    async def spawn(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        raise SandboxError(f"the {type(self).__name__.removesuffix('Sandbox').lower()} backend cannot keep a command's "
                           "standard input open (an MCP server over stdio): local, docker and singularity can")

    async def end_processes(self) -> None:
        """In a PID namespace of the sandbox's own: freeze everything at once, kill all but PID 1
        (and the keepers of another user), then make sure nothing is left running."""
        if not self.own_pid_namespace:
            raise SandboxError(f"{type(self).__name__} cannot end a prompt's processes")
        res = await self._sh(end_processes_script(self.others_are_keepers, self.started_by_sandbox), timeout=60)
        if res.exit_code == 137 and not res.timed_out:  # SIGKILL: nothing of the runner's sends it, the OOM killer does
            raise SandboxExhausted("the runner's command that ends the agent's processes was killed: what the agent "
                                   "left uses up the sandbox's memory (files in a memory-backed /tmp count)")
        if res.exit_code != 0:
            raise SandboxError(f"could not end the prompt's processes: {res.stderr.strip() or res.stdout.strip()}")

    async def resolve(self, path: str) -> str:
        res = await self._sh(resolve_script(path))
        if res.exit_code != 0:  # a link into nowhere: the call's error, not the sandbox's
            raise FileNotFoundError(f"cannot resolve {path!r}: {res.stderr.strip() or 'a symbolic link leads nowhere'}")
        return res.stdout.strip()

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        """In chunks small enough for any backend's output cap (Flame's is ~200 KB per stream); the
        first one also checks what `path` is (a FIFO would block, a directory is no file)."""
        q = shlex.quote(path)
        check = (f"if [ -d {q} ]; then echo 'is a directory' >&2; exit 21; fi; [ -r {q} ] || exit 2; "
                 f"[ -f {q} ] || {{ echo 'not a regular file' >&2; exit 22; }}; ")
        data = bytearray()
        while len(data) < max_bytes:
            want = min(READ_CHUNK, max_bytes - len(data))
            limit = want * 14 // 10 + 4096  # base64: 4/3 the size, plus newlines
            res = await whole_output(functools.partial(self._sh, output_limit=limit),
                                     f"{check if not data else ''}tail -c +{len(data) + 1} -- {q} | head -c {want} | base64",
                                     f"reading {path}")
            if res.exit_code in (2, 21, 22) and not data:
                raise FileNotFoundError(res.stderr.strip() or f"cannot read {path}")
            if res.exit_code != 0:
                raise OSError(res.stderr.strip() or f"cannot read {path} (exit {res.exit_code}): {res.stdout.strip()[-300:]}")
            try:
                chunk = base64.b64decode(res.stdout.replace("\n", ""), validate=True)
            except ValueError:
                raise OSError(f"reading {path} came back garbled (output cut short?)") from None
            data += chunk
            if len(chunk) < want:
                break
        return bytes(data)

    async def write_file(self, path: str, data: bytes) -> None:
        """Through a temporary file nobody can have planted a link at, renamed over `path`: one exec
        for up to 45 KB, one more per further 45 KB (each part is one argv string)."""
        q = shlex.quote(path)
        tmp = shlex.quote(posixpath.join(posixpath.dirname(path), f".hb-{secrets.token_hex(8)}.tmp"))
        encoded = base64.b64encode(data).decode()
        chunk = 60_000  # well under MAX_ARG_STRLEN
        parts = [encoded[i : i + chunk] for i in range(0, len(encoded), chunk)] or [""]
        for i, part in enumerate(parts):
            script = f"printf %s {shlex.quote(part)} | base64 -d >> {tmp}"
            if i == 0:  # created only if absent (noclobber), after checking what `path` is now
                script = (f"if [ -L {q} ] || {{ [ -e {q} ] && [ ! -f {q} ]; }}; then exit 90; fi; "
                          f"mkdir -p -- {shlex.quote(posixpath.dirname(path))} && "
                          f"(set -C; printf %s {shlex.quote(part)} | base64 -d > {tmp})")
            if i == len(parts) - 1:
                script = f"{script} && mv -f -- {tmp} {q}"
            res = await self._sh(script)
            if res.exit_code == 90:
                raise OSError(f"{path} exists and is not a regular file")
            if res.exit_code != 0:
                await self._sh(f"rm -f -- {tmp}")
                raise OSError(res.stderr.strip() or f"cannot write {path}")

    async def run_snippets(self, codes: list[str], *, language: Language, timeout: float) -> list[ExecResult]:
        """The `session` tool off Flame: each snippet in a fresh scratch directory, in parallel, in input order."""
        gate = asyncio.Semaphore(max(1, self.session_parallelism))

        async def one(code: str) -> ExecResult:
            async with gate:
                self._snippet_counter += 1
                space = posixpath.join(self.scratch, f"snippet-{self._snippet_counter}-{time.monotonic_ns()}")
                mk = await self._sh(f"mkdir -p -- {shlex.quote(space)}")
                if mk.exit_code != 0:
                    return ExecResult(-1, "", f"cannot create scratch space: {mk.stderr.strip()}")
                try:
                    return await self.exec(
                        code, language=language, timeout=timeout, cwd=space,
                        env={"HOME": space, "TMPDIR": space},
                    )
                except Exception as exc:  # one snippet's infrastructure failure must not sink the others
                    return ExecResult(-1, "", f"{type(exc).__name__}: {exc}")
                finally:
                    await self._sh(f"rm -rf -- {shlex.quote(space)}")

        return list(await asyncio.gather(*(one(c) for c in codes)))


async def whole_output(run: Callable[[str], Awaitable[ExecResult]], script: str, what: str) -> ExecResult:
    """`script` run by `run`, its output known whole: a mark is echoed after it when it succeeds, and
    taken off again. An output lost on its way back (exit 0, no mark) would read as an empty one: it
    is asked once more, then is the sandbox's error."""
    for _ in range(2):
        res = await run(f"{script} && echo {END_MARK}")
        if res.exit_code != 0:
            return res
        if res.stdout.endswith(END_MARK + "\n"):
            return replace(res, stdout=res.stdout[: -len(END_MARK) - 1])
    raise SandboxError(f"{what}: the sandbox's output was lost twice on its way back")


async def run_process(
    argv: list[str], *, cwd: str | None, env: dict[str, str], timeout: float, limit: int,
    on_start=None, drain_after_exit: float = 1.0,
) -> ExecResult:
    """Run a host process in its own process group with bounded output; kill the group on timeout.

    `on_start(pid)` learns the group id (so a sandbox can kill leftovers at close). A background
    job may keep the pipes open after the command exits: reading stops `drain_after_exit` later.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    if on_start:
        on_start(proc.pid)
    assert proc.stdout is not None and proc.stderr is not None  # both piped
    ended = exit_status(proc)

    async def kill() -> None:
        kill_group(proc.pid)
        # what left its group (in an Apptainer instance, `timeout`'s own) lives on until the sandbox closes
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(ended), KILL_GRACE)

    return await supervise(asyncio.shield(ended), kill, proc.stdout, proc.stderr, timeout=timeout, limit=limit,
                           drain_after_exit=drain_after_exit)


def exit_status(proc: asyncio.subprocess.Process) -> asyncio.Future[int]:
    """`proc`'s exit status, once it has exited: asyncio's own wait() also waits for its pipes to
    close, which a background job it left (`server &`) holds open for as long as that job lives.
    Called as soon as `proc` is made (its pid cannot be another's before it is reaped)."""
    loop = asyncio.get_running_loop()
    status: asyncio.Future[int] = loop.create_future()
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # gone already, or no pidfd here: asyncio's wait, pipes and all
        return asyncio.ensure_future(proc.wait())

    def exited() -> None:  # the child watcher reaps it and hands its status over in a moment
        loop.remove_reader(fd)
        os.close(fd)
        task = asyncio.ensure_future(_reaped(proc, status))
        _REAPING.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(_REAPING.discard)

    loop.add_reader(fd, exited)
    return status


_REAPING: set[asyncio.Task[None]] = set()


async def _reaped(proc: asyncio.subprocess.Process, status: asyncio.Future[int]) -> None:
    while proc.returncode is None:
        await asyncio.sleep(0.002)
    if not status.done():
        status.set_result(proc.returncode)


class HostProcess(Process):
    """A process of this machine (in its own process group) spawned with its stdin open: the
    unisolated local backend's, and Apptainer's `exec` into an instance."""

    def __init__(self, proc: asyncio.subprocess.Process):
        super().__init__()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.ended = exit_status(proc)
        self.stdout = proc.stdout
        self._stderr_task = asyncio.ensure_future(self.keep_stderr(proc.stderr))

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        if self.proc.stdin.is_closing():
            raise BrokenPipeError("the command's standard input is closed")
        self.proc.stdin.write(data)

    async def drain(self) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.drain()

    async def wait(self) -> int | None:
        return await asyncio.shield(self.ended)

    async def close(self) -> None:
        kill_group(self.proc.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.ended), KILL_GRACE)
        self._stderr_task.cancel()


async def spawn_process(argv: list[str], *, cwd: str | None, env: dict[str, str], on_start=None) -> HostProcess:
    """A host process in its own process group, its stdin and stdout open to the caller."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=1 << 24)  # a line of JSON-RPC may be large
    if on_start:
        on_start(proc.pid)
    return HostProcess(proc)


async def supervise(
    exited: Awaitable[int | None], kill: Callable[[], Awaitable[None]], stdout: asyncio.StreamReader,
    stderr: asyncio.StreamReader, *, timeout: float, limit: int, drain_after_exit: float,
    after_exit: Callable[[], None] | None = None,
) -> ExecResult:
    """Read a running command's two streams (bounded) until it exits; `kill` it at `timeout` or
    when cancelled. `after_exit` runs once it has ended, before the last of its output is read."""
    started = time.monotonic()
    out, err = BoundedBuffer(limit), BoundedBuffer(limit)
    readers = [asyncio.ensure_future(_pump(stdout, out)), asyncio.ensure_future(_pump(stderr, err))]
    timed_out, code = False, None
    try:
        code = await asyncio.wait_for(exited, timeout)
    except TimeoutError:
        timed_out = True
        await kill()
    except asyncio.CancelledError:
        await asyncio.shield(kill())
        raise
    finally:
        if after_exit:
            after_exit()
        _, pending = await asyncio.wait(readers, timeout=drain_after_exit)
        for r in pending:
            r.cancel()
    return ExecResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else -1),
        stdout=decode(out.getvalue()), stderr=decode(err.getvalue()),
        duration=time.monotonic() - started, timed_out=timed_out,
    )


async def _pump(stream: asyncio.StreamReader, sink: BoundedBuffer) -> None:
    while chunk := await stream.read(65536):
        sink.feed(chunk)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_processes_script(others_are_keepers: bool, started_by_sandbox: int | None = None) -> str:
    """POSIX sh, run inside a PID namespace: `kill -STOP -1` freezes every other process at once
    (none can fork after it), each is then killed but PID 1, this script and its ancestors (the
    exec's `timeout`), with `others_are_keepers` every process of another user than this script's,
    and with `started_by_sandbox` (a capability's bit) every process whose bounding set holds it.
    Between the freeze and the kill only shell builtins run. Exits 1 naming what is still
    running. Nothing is sent to /dev/null (`2>&-` closes stderr instead): the agent may have made it
    unusable, and a redirection that fails skips its command."""
    # the whole of stat, whose name field may hold newlines and ") ": the fields follow its last ") "
    whole = 's=; while IFS= read -r l || [ -n "$l" ]; do s="$s$l "; done 2>&- < '
    stat = whole + '"$d/stat"; [ -n "$s" ] || continue; s=${s##*) }; set -- $s; '
    # the real uid, from status: a directory's owner can read root (gVisor, a process not dumpable)
    # the last line so named: a process's name (status's first line, not escaped under gVisor) may hold a fake one
    uid = 'u=; while read -r k a _; do [ "$k" = Uid: ] && u=$a; done 2>&- < '
    # where the image's processes are told by a capability, only PID 1 is the keeper's: a check
    # holding CAP_SETUID could otherwise leave a process of another user behind
    keep_uid = others_are_keepers and started_by_sandbox is None
    mine = (uid + '"$d/status"; [ "$u" = "$me" ] || continue; ') if keep_uid else ""
    if started_by_sandbox is not None:  # a process that cannot be read is not spared
        mine += ('b=0; while read -r k a _; do [ "$k" = CapBnd: ] && b=$a; done 2>&- < "$d/status"; '
                 f'[ $(( 0x$b & {1 << started_by_sandbox} )) -eq 0 ] || continue; ')
    return (
        (uid + '/proc/$$/status; me=$u; ' if keep_uid else "") +
        'spare=" 1 $$ "; p=$$; '
        'while [ "$p" -gt 1 ]; do ' + whole + '"/proc/$p/stat"; [ -n "$s" ] || break; s=${s##*) }; set -- $s; '
        'p=$2; spare="$spare$p "; done; '
        'kill -STOP -1 2>&-; '
        'for d in /proc/[0-9]*; do p=${d#/proc/}; ' + mine +
        'case "$spare" in *" $p "*) ;; *) kill -KILL "$p" 2>&-;; esac; done; '
        'kill -CONT -1 2>&-; '
        'for try in 1 2 3 4 5 6 7 8 9 10; do left=; '
        'for d in /proc/[0-9]*; do p=${d#/proc/}; ' + mine + 'case "$spare" in *" $p "*) continue;; esac; ' + stat +
        'case "$1" in Z|X) ;; *) left="$left $p";; esac; done; '
        '[ -z "$left" ] && exit 0; for p in $left; do kill -KILL "$p" 2>&-; done; sleep 0.2 2>&- || sleep 1; '
        'done; echo "still running after SIGKILL:$left" >&2; exit 1'
    )


def resolve_script(path: str) -> str:
    """POSIX sh that prints `path` with every symlink resolved, for a path that need not exist
    (GNU `realpath -m`, which BusyBox lacks): resolve the longest existing prefix, keep the rest."""
    return (
        f"p={shlex.quote(posixpath.normpath(path))}; rest=; "
        'while [ "$p" != / ] && [ ! -e "$p" ] && [ ! -L "$p" ]; do rest="/${p##*/}$rest"; p="${p%/*}"; '
        '[ -n "$p" ] || p=/; done; '
        'r=$(readlink -f "$p") || exit 1; [ "$r" = / ] && r=; out="$r$rest"; printf "%s\n" "${out:-/}"'
    )


def killed_by_timeout(code: int | None, elapsed: float, timeout: float) -> bool:
    """`timeout` inside the sandbox killed the command: coreutils says 124, BusyBox 143 (TERM), and
    137 after the KILL that follows; a command may exit so by itself, so the time must agree."""
    return code in (TIMEOUT_EXIT_CODE, 137, 143) and elapsed >= timeout - 0.05


def shell_argv(code: str, language: Language, shell: str = "bash") -> list[str]:
    """The argv that runs `code` inline in `language`."""
    if language == "python":
        return ["python3", "-c", code]
    return [shell, "-c", code]
