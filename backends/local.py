"""Local backend: each prompt gets its own directory on this host; every command runs in a jail.

Isolation (`--local_isolation`, default `bwrap`): each command runs under bubblewrap in new user,
PID, mount, IPC, UTS and network namespaces (`--network` keeps the host's network). It sees the
host's `/usr` and `/etc` read-only, a private `/tmp`, its own `/proc`, and the prompt's directory
as the only writable place; home directories, the run's files and every other process are not
there. When the runner is root, the jail runs as `nobody`, so files only root may read stay
unreadable. The command's PID namespace dies with it: nothing it started outlives the command.

`--local_isolation=none` runs commands as plain subprocesses of the worker with a scrubbed
environment: no isolation at all (code can read what the runner's user can, `/proc` included).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from .base import (
    BackendSettings,
    BaseBackend,
    ExecResult,
    Language,
    SandboxError,
    SandboxSpec,
    ShellSandbox,
    kill_group,
    run_process,
)

# Variables a command may see; everything else of the runner's environment (API keys!) stays out.
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
_ALIASES = "/run/hermes-batch/bin"  # inside the jail only
_JAIL_PATH = f"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{_ALIASES}"
_PIPE_DRAIN_AFTER_EXIT = 1.0  # a background job may hold stdout open; stop waiting for it after this
NOBODY = 65534  # the jail's user when the runner is root


def sandbox_root(settings: BackendSettings) -> Path:
    base = Path(settings.sandbox_root or os.path.join(tempfile.gettempdir(), "hermes-batch"))
    # one directory per run, so the orphan sweep of one run never touches another's sandboxes
    return base / settings.run_label


class Jail:
    """The bubblewrap command line that confines one command to one prompt's directory."""

    def __init__(self, network: bool):
        self.network = network
        self.as_nobody = os.geteuid() == 0
        self.owner = NOBODY if self.as_nobody else os.geteuid()
        self._head, self._then = self._fixed_parts()  # what is the same for every command: built once

    def _fixed_parts(self) -> tuple[list[str], list[str]]:
        if self.as_nobody:
            # namespaces made as root, then the command becomes the real `nobody` with no
            # capabilities and no way back (setuid binaries are inert under no_new_privs)
            head = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
            if not self.network:
                head.append("--unshare-net")
            then = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs",
                    "--inh-caps=-all", "--bounding-set=-all"]
        else:  # an unprivileged runner: a user namespace of its own, capabilities dropped
            head = ["bwrap", "--unshare-all", *(["--share-net"] if self.network else []), "--cap-drop", "ALL"]
            then = []
        head += ["--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = f"/{top}"
            if os.path.islink(path):
                head += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                head += ["--ro-bind", path, path]
        if not os.path.exists("/usr/bin/python") and os.path.exists("/usr/bin/python3"):
            # Debian has no `python`; models type it all the time
            head += ["--dir", _ALIASES, "--symlink", "/usr/bin/python3", f"{_ALIASES}/python"]
        head += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/var/tmp"]
        return head, then

    def argv(self, root: str, cwd: str, command: list[str]) -> list[str]:
        # the prompt's own /tmp persists between its commands (the Flame article's semantics)
        argv = [*self._head, "--bind", f"{root}/tmp", "/tmp"]
        for ancestor in reversed(Path(root).parents[:-1]):  # bwrap would make them 0700: unusable to nobody
            if str(ancestor) not in ("/tmp", "/var/tmp"):
                argv += ["--perms", "0755", "--dir", str(ancestor)]
        return [*argv, "--bind", root, root, "--chdir", cwd, "--", *self._then, *command]

    def check(self, root: Path) -> None:
        """One jailed `true`: refuse to start (with the way out) where this host cannot jail."""
        missing = [exe for exe in ["bwrap"] + (["setpriv"] if self.as_nobody else []) if not shutil.which(exe)]
        why = f"{', '.join(missing)} not found (apt-get install bubblewrap util-linux)" if missing else ""
        if not why:
            (root / "tmp").mkdir(parents=True, exist_ok=True)
            try:
                proc = subprocess.run(self.argv(str(root), str(root), ["true"]), capture_output=True, text=True,
                                      timeout=30, env={"PATH": _JAIL_PATH})
                why = "" if proc.returncode == 0 else (proc.stderr.strip() or f"exit code {proc.returncode}")
            except (OSError, subprocess.SubprocessError) as exc:
                why = str(exc)
        if why:
            raise SandboxError(
                f"the local backend cannot isolate prompts here with bubblewrap: {why}. Install bubblewrap and "
                "allow user namespaces (sysctl user.max_user_namespaces > 0), use --backend=docker, or pass "
                "--local_isolation=none to run model-written code on this host without isolation")


class LocalSandbox(ShellSandbox):
    def __init__(self, root: Path, settings: BackendSettings, jail: Jail | None):
        self.root = root
        self.jail = jail
        self.workdir = os.path.realpath(root / "work")
        self.scratch = os.path.realpath(root / "tmp")
        self.output_limit = settings.output_limit
        self.session_parallelism = settings.session_parallelism
        self.shell = "bash" if shutil.which("bash") else "sh"
        self._groups: set[int] = set()
        self._closed = False
        site = os.path.join(self.scratch, "site-packages")
        self.env = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
        self.env.setdefault("PATH", _JAIL_PATH)
        if jail is not None:
            self.env["PATH"] = _JAIL_PATH  # the runner's own PATH may point into hidden directories
        self.env.update(
            HOME=self.workdir, TMPDIR=self.scratch, PYTHONUNBUFFERED="1",
            PIP_TARGET=site, PYTHONPATH=site, PIP_DISABLE_PIP_VERSION_CHECK="1",
        )

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError("sandbox is closed")
        argv = await self._code_argv(code, language, self.shell)
        cwd = cwd or self.workdir
        if self.jail is not None:
            argv = self.jail.argv(str(self.root), cwd, argv)
        # unjailed, the group outlives the command when it leaves background jobs: killed at close
        return await run_process(argv, cwd=cwd, env={**self.env, **(env or {})}, timeout=timeout,
                                 limit=output_limit or self.output_limit, on_start=self._groups.add,
                                 drain_after_exit=_PIPE_DRAIN_AFTER_EXIT)

    async def resolve(self, path: str) -> str:
        return os.path.realpath(path)

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        def read() -> bytes:
            fd = _open_regular(path, os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                return f.read(max_bytes)

        return await asyncio.to_thread(read)

    async def write_file(self, path: str, data: bytes) -> None:
        owner = self.jail.owner if self.jail is not None else None
        await asyncio.to_thread(_write_regular, path, data, owner)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in self._groups:
            kill_group(pgid)
        if self.jail is None:
            await asyncio.to_thread(_kill_tagged, self.root)
        await asyncio.to_thread(shutil.rmtree, self.root, True)


def _open_regular(path: str, flags: int) -> int:
    """Open without following a final symlink and without blocking on a FIFO; regular files only."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _write_regular(path: str, data: bytes, owner: int | None) -> None:
    """Write through a fresh temporary file that cannot be a planted link, then rename it over `path`."""
    parent = os.path.dirname(path)
    made, d = [], parent
    while not os.path.lexists(d):
        made.append(d)
        d = os.path.dirname(d)
    os.makedirs(parent, exist_ok=True)
    uid = owner if owner is not None and owner != os.geteuid() else None
    for d in reversed(made):
        if uid is not None:  # the jailed user must be able to use what the tool made
            os.chown(d, uid, uid, follow_symlinks=False)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{path} exists and is not a regular file")
    tmp = os.path.join(parent, f".hb-{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if uid is not None:
                os.fchown(f.fileno(), uid, uid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _kill_tagged(root: Path) -> None:
    """Unjailed: processes that left the command's group (`setsid cmd &`) still have the sandbox's
    TMPDIR in their environment; find them by it and kill them."""
    tag = f"TMPDIR={os.path.realpath(root / 'tmp')}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    os.kill(int(entry), 9)
        except (OSError, ProcessLookupError):
            continue


class LocalBackend(BaseBackend):
    name = "local"
    starts_cheaply = True  # two directories

    def __init__(self, settings: BackendSettings):
        super().__init__(settings)
        self.root = sandbox_root(settings)
        self.jail = Jail(settings.network) if settings.local_isolation == "bwrap" else None

    async def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.jail is not None:
            probe = self.root / f".probe-{os.getpid()}-{secrets.token_hex(3)}"
            try:
                await asyncio.to_thread(self.jail.check, probe)
            finally:
                shutil.rmtree(probe, ignore_errors=True)

    async def start(self, spec: SandboxSpec) -> LocalSandbox:
        name = f"{hashlib.sha1(spec.prompt_id.encode()).hexdigest()[:12]}-{secrets.token_hex(3)}"
        root = self.root / name
        os.mkdir(root)  # plain calls: Path.mkdir(parents=True) tries, fails and raises its way down
        os.mkdir(root / "work")
        os.mkdir(root / "tmp")
        if self.jail is not None:
            os.chmod(root, 0o700)  # only this prompt's jail (and the runner) may enter it
            if self.jail.owner != os.geteuid():
                for p in (root, root / "work", root / "tmp"):
                    os.chown(p, self.jail.owner, self.jail.owner)
        return LocalSandbox(root, self.settings, self.jail)

    async def sweep_orphans(self) -> int:
        """Remove sandboxes that an earlier, crashed run with this label left behind."""
        if not self.root.is_dir():
            return 0
        leftovers = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".probe-")]
        for p in leftovers:
            shutil.rmtree(p, ignore_errors=True)
        return len(leftovers)
