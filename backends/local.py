"""Local backend: each prompt gets its own directory on this host; every command runs in a jail.

Isolation (`--local_isolation`, default `bwrap`): each prompt gets one bubblewrap jail, in new
user, PID, mount, IPC, UTS and network namespaces, made at its first command. Its network is its
own, `--network` or not (loopback, ports and abstract sockets of its own); with `--network` its one
way out is the runner's network guard, placed on its loopback (egress.py). It sees the host's
`/usr` and `/etc` read-only, its own `/proc`, its work directory at `/workspace` and its own `/tmp`
(also `/var/tmp`), and nothing else: not the host's path to its directory, not home directories,
the run's files or any other process. The jail's root is read-only. When the runner is root, the jail runs as `nobody`, so files only root may
read stay unreadable. A shell inside the jail runs each command in a fork of its own (a jail costs
~5 ms of CPU, a fork ~1 ms); the jail, and everything the prompt started in it, is killed when
the prompt's sandbox closes.

The runner never opens a path inside a prompt's directory: the file tools read and write through
the jail's shell, as the jail's user, and the jail's mounts come from directories the prompt
cannot see (its directory's own entries, `work` and `tmp`, in a directory only the runner may
enter). As root, a prompt's files live on a filesystem of `--disk` bytes of their own (disk.py).

`--local_isolation=none` runs commands as plain subprocesses of the worker with a scrubbed
environment: no isolation at all (code can read what the runner's user can, `/proc` included).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import json
import os
import posixpath
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from .base import (
    CONTAINER_WORKDIR,
    DRIVER_MOUNT,
    HARNESS_MOUNT,
    RUNNER_ENV,
    BackendSettings,
    Egress,
    ExecResult,
    Language,
    Process,
    SandboxError,
    SandboxSpec,
    ShellSandbox,
    flag,
    kill_group,
    run_process,
    spawn_process,
    supervise,
)
from .disk import Disks, HostDirectories, SandboxRootSettings, remove_tree
from .egress import egress_env, listener_inside

# Variables a command may see; everything else of the runner's environment (API keys!) stays out.
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
_ALIASES = "/run/hermes-batch/bin"  # inside the jail only
_JAIL_PATH = f"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{_ALIASES}"
_PIPE_DRAIN_AFTER_EXIT = 1.0  # a background job may hold stdout open; stop waiting for it after this
SHM_SIZE = 64 * 1024 * 1024  # the jail's /dev/shm (memory), as Docker's default

# The shell inside a prompt's jail. Requests come one per line on stdin: `R <id>` runs the command
# described by <ctl>/<id>.req (NUL-separated: cwd, mode, number of variables, NAME=value..., then
# the code to `eval` or the argv to `exec`) with its input from the FIFO <id>.in where the runner
# made one (a spawned command), else /dev/null, its output into the FIFOs <id>.out and .err, and
# answers `E <id> <exit code>` on stdout; `K <id>` kills that command's process group. Each command
# runs in a forked subshell of a forked waiter (its own process group, by `set -m`), so a command
# cannot change the shell that runs the next one. The waiter is disowned at once: bash's table of
# jobs would otherwise keep every command the prompt ran and walk it at each start (the 3,000th
# command took 3.5 times the first). The control directory is the runner's, outside the prompt's
# directory, and mounted read-only in the jail.
_SHELL_SERVER = r"""exec 2>/dev/null
set -m
declare -A __hb_jobs
while IFS=' ' read -r __hb_op __hb_id; do
  case $__hb_op in
  R)
    {
      if [[ -p $HB_CTL/$__hb_id.in ]]; then exec 0<"$HB_CTL/$__hb_id.in"; else exec 0</dev/null; fi
      (
        set +m
        __hb_req=$HB_CTL/$__hb_id
        exec 1>"$__hb_req.out" 2>"$__hb_req.err" 3<"$__hb_req.req"
        IFS= read -r -d '' __hb_cwd <&3
        IFS= read -r -d '' __hb_mode <&3
        IFS= read -r -d '' __hb_n <&3
        while (( __hb_n-- > 0 )); do IFS= read -r -d '' __hb_arg <&3; export "$__hb_arg"; done
        __hb_argv=()
        while IFS= read -r -d '' __hb_arg <&3; do __hb_argv+=("$__hb_arg"); done
        exec 3<&-
        cd -- "$__hb_cwd" || exit 1
        unset -v __hb_jobs __hb_op __hb_id __hb_req __hb_cwd __hb_n __hb_arg HB_CTL
        [[ $__hb_mode == eval ]] || exec "${__hb_argv[@]}"
        __hb_code=${__hb_argv[0]}
        unset -v __hb_argv __hb_mode
        eval "$__hb_code"
      )
      printf 'E %s %s\n' "$__hb_id" "$?"
    } &
    __hb_jobs[$__hb_id]=$!
    disown $!
    ;;
  K)
    [[ -n ${__hb_jobs[$__hb_id]-} ]] && kill -KILL -- "-${__hb_jobs[$__hb_id]}"
    unset -v "__hb_jobs[$__hb_id]"
    ;;
  esac
done
"""
_CTL_IN_JAIL = "/run/hermes-batch/ctl"  # where the jail sees its control directory
_CLOSE_GRACE = 2.0  # seconds for a closing jail to end by itself before it is killed
_SHELL_GONE = 137  # a command whose jail died under it (`kill -9 -1`, the OOM killer) reports a KILL
# the signals that stop a process, as a set in /proc/<pid>/status (bit n-1 for signal n)
_STOP_SIGNALS = sum(1 << (s - 1) for s in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU))
_WATCH = 1.0  # seconds between looks at a jail's shell while a command runs (is it stopped?)
_JAIL_KILLED = "\n[the sandbox's jail was killed; the next command starts a new one]"
_JAIL_REPLACED = ("[the sandbox's shell had been stopped: this command ran in a new jail, without the old one's "
                  "background jobs]\n")


class LocalSettings(SandboxRootSettings):
    local_isolation: Literal["bwrap", "none"] = flag("bwrap", "each prompt in a bubblewrap jail, or none (unsafe)")


def control_dir(top: str) -> str:
    """The runner's directory for talking to a prompt's jail: beside the prompt's, not inside it."""
    return f"{top}.ctl"


# When the runner is root, each prompt's commands run as a uid of their own, drawn from a range no
# account of the host uses: the kernel counts its processes against --pids_limit (a fork bomb stops
# there, not at the host's limit), and no two prompts share an identity. The uid has no name, as
# in a container run with `--user`.
JAIL_UIDS = range(0x6000_0000, 0x7000_0000)
# Calls no jailed command makes a living from, denied (EPERM) to everything in the jail: the kernel's
# keyrings are not namespaced (the runner's session keyring, a keyring shared by every prompt of
# one uid), and ptrace-like access to the jail's own shell would let a command take its pipes to
# the runner. As Docker's default profile does for the keyrings; gdb and strace do not work here.
DENIED_SYSCALLS = ("keyctl", "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev",
                   "pidfd_getfd")


def seccomp_filter() -> bytes:
    """The jail's seccomp program (classic BPF, as bwrap --seccomp reads it), for every ABI this
    machine runs (a 32-bit call of a denied syscall is denied too)."""
    import pyseccomp

    flt = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    extra = {"x86_64": ("X86", "X32"), "aarch64": ("ARM",)}.get(os.uname().machine, ())
    for arch in extra:
        with contextlib.suppress(Exception):  # a kernel built without that ABI
            flt.add_arch(getattr(pyseccomp.Arch, arch))
    for name in DENIED_SYSCALLS:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read()


class Jail:
    """The bubblewrap command line that confines a prompt's shell (or one probe command) to the
    prompt's `work` (at /workspace) and `tmp` (at /tmp)."""

    def __init__(self, network: bool, pids_limit: int, driver_dir: str | None = None, harness_dir: str | None = None):
        self.network = network
        self.driver_dir = driver_dir
        self.harness_dir = harness_dir
        self.as_root = os.geteuid() == 0
        self.pids_limit = pids_limit if self.as_root else None  # unprivileged, the uid is the runner's own
        self._head = self._fixed_part()  # what is the same for every command: built once
        self._filter = seccomp_filter()

    def owner(self) -> int:
        """A uid for a new prompt's jail (and its files)."""
        return secrets.choice(JAIL_UIDS) if self.as_root else os.geteuid()

    def _fixed_part(self) -> list[str]:
        if self.as_root:  # namespaces made as root; the command then drops to the prompt's uid (argv)
            # a network of its own, with or without --network (whose way out is placed in it: egress.py)
            head = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net"]
        else:  # an unprivileged runner: a user namespace of its own, capabilities dropped
            head = ["bwrap", "--unshare-all", "--cap-drop", "ALL"]
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
        # every mount point is made here, on the jail's own root, never inside a directory the
        # prompt can write (where a link it planted would take a mount, as root, anywhere)
        head += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(SHM_SIZE), "--tmpfs", "/dev/shm",
                 "--perms", "0755", "--dir", "/var", "--symlink", "/tmp", "/var/tmp"]
        if self.driver_dir:  # the browser driver, a public static binary: read-only, on the jail's root
            head += ["--perms", "0755", "--dir", posixpath.dirname(DRIVER_MOUNT), "--ro-bind", self.driver_dir, DRIVER_MOUNT]
        if self.harness_dir:  # the agent harness the run drives (--agent), installed once: read-only, on the jail's root
            head += ["--perms", "0755", "--dir", posixpath.dirname(HARNESS_MOUNT), "--ro-bind", self.harness_dir,
                     HARNESS_MOUNT]
        return head

    def filter_fd(self) -> int:
        """A descriptor of the seccomp program for one bwrap (each reads its own from the start)."""
        fd = os.memfd_create("hermes-batch-seccomp", os.MFD_CLOEXEC)
        os.write(fd, self._filter)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def argv(self, top: str, command: list[str], *, owner: int, filter_fd: int, cwd: str = CONTAINER_WORKDIR,
             ctl: str | None = None, info_fd: int | None = None) -> list[str]:
        """`top` holds the prompt's `work` and `tmp`; the prompt never sees `top` itself, so these
        two entries stay the runner's directories whatever the prompt does (they are bound by name).
        `info_fd`: where bwrap writes the jail's first process (its pid: what its namespaces are known by)."""
        argv = [*self._head, *(["--info-fd", str(info_fd)] if info_fd is not None else []),
                "--bind", f"{top}/work", CONTAINER_WORKDIR, "--bind", f"{top}/tmp", "/tmp"]
        if ctl is not None:  # the jail sees it only here, read-only: it can neither change nor replace it
            argv += ["--ro-bind", ctl, _CTL_IN_JAIL]
        argv += ["--remount-ro", "/", "--seccomp", str(filter_fd), "--chdir", cwd, "--"]
        if self.as_root:  # the real uid of the prompt, no capabilities and no way back (setuid is inert)
            argv += ["setpriv", f"--reuid={owner}", f"--regid={owner}", "--clear-groups", "--no-new-privs",
                     "--inh-caps=-all", "--bounding-set=-all"]
        return [*argv, *command]

    def server_script(self) -> str:
        """The shell the jail runs; as root, it caps the prompt's processes first (commands inherit the cap)."""
        return (f"ulimit -u {self.pids_limit}\n" if self.pids_limit else "") + _SHELL_SERVER

    def check(self, probe: Path) -> None:
        """One jailed `true`: refuse to start (with the way out) where this host cannot jail."""
        missing = [exe for exe in ["bwrap", "bash"] + (["setpriv"] if self.as_root else []) if not shutil.which(exe)]
        why = f"{', '.join(missing)} not found (apt-get install bubblewrap bash util-linux)" if missing else ""
        if not why:
            owner = self.owner()
            for name in ("work", "tmp"):
                (probe / name).mkdir(parents=True, exist_ok=True)
                os.chown(probe / name, owner, owner)
            fd = self.filter_fd()
            try:
                proc = subprocess.run(self.argv(str(probe), ["true"], owner=owner, filter_fd=fd), capture_output=True,
                                      text=True, timeout=30, env={"PATH": _JAIL_PATH}, pass_fds=(fd,))
                why = "" if proc.returncode == 0 else (proc.stderr.strip() or f"exit code {proc.returncode}")
            except (OSError, subprocess.SubprocessError) as exc:
                why = str(exc)
            finally:
                os.close(fd)
        if why:
            raise SandboxError(
                f"the local backend cannot isolate prompts here with bubblewrap: {why}. Install bubblewrap and "
                "allow user namespaces (sysctl user.max_user_namespaces > 0), use --backend=docker, or pass "
                "--local_isolation=none to run model-written code on this host without isolation")


class JailShell:
    """One prompt's jail and the shell in it (`_SHELL_SERVER`), which runs the prompt's commands."""

    def __init__(self, jail: Jail, top: str, env: dict[str, str], owner: int, egress: Egress | None = None):
        self.jail, self.top, self.env, self.owner = jail, top, env, owner
        self.egress = egress  # --network: the way out, placed in each new jail's network before its first command
        self._egress_stop: Callable[[], Awaitable[None]] | None = None
        self.ctl = control_dir(top)
        self.proc: asyncio.subprocess.Process | None = None
        self._exits: dict[str, asyncio.Future[int | None]] = {}
        self._unanswered: set[str] = set()  # commands given up on (timeout): a late answer may still come
        self._count = 0
        self._gone = False  # the jail has ended: no command will be answered
        self._shell_pid: int | None = None  # the shell's pid on the host, once seen
        self._info = -1  # bwrap's --info-fd, until read (jail_pid)
        self._pid: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self._gone

    async def start(self) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.ctl, 0o711)  # the runner's: the jail's user may only open what is named to it
        with open(os.path.join(self.ctl, "shell"), "w") as f:  # a file, not `-c`: `ps` shows its name, not its text
            f.write(self.jail.server_script())
        fd = self.jail.filter_fd()
        info_read, info_write = os.pipe2(os.O_CLOEXEC)  # bwrap names the jail's first process there
        try:
            # from /: each command goes to its own directory (a work directory made unenterable stops no jail)
            argv = self.jail.argv(self.top, ["bash", "--norc", "--noprofile", f"{_CTL_IN_JAIL}/shell"],
                                  owner=self.owner, filter_fd=fd, ctl=self.ctl, cwd="/", info_fd=info_write)
            # bwrap's own words come through a pipe, not a file: nothing in the jail can grow it
            self.proc = await asyncio.create_subprocess_exec(
                *argv, env={**self.env, "HB_CTL": _CTL_IN_JAIL}, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                pass_fds=(fd, info_write))
        except BaseException:
            os.close(info_read)
            raise
        finally:
            os.close(fd)
            os.close(info_write)
        self._info = info_read
        asyncio.ensure_future(self._read_replies(self.proc))
        if self.egress is not None:
            try:
                pid = await self.jail_pid()
                # before the jail's first command: nothing of the prompt's can hold the port first
                listener = await listener_inside(pid)
                self._egress_stop = await self.egress.serve(listener, os.path.basename(self.top))
            except BaseException:
                self.kill()
                raise

    async def jail_pid(self) -> int:
        """The jail's first process on this machine (what its namespaces are known by), as bwrap named it."""
        if self._pid is None:
            info, self._info = self._info, -1
            if info < 0:
                raise SandboxError("the prompt's jail is not running")
            pid = await asyncio.wait_for(_jail_pid(info), 30)
            if pid is None:
                raise SandboxError(f"the prompt's jail did not start: {await self._failure()}")
            self._pid = pid
        return self._pid

    async def _read_replies(self, proc: asyncio.subprocess.Process) -> None:
        """Answers are `E <id> <exit code>`, one per command; anything else on this pipe was put there
        by the prompt (a command can reach the shell's descriptors): the jail ends at once, so that a
        flood of it cannot keep this worker's event loop busy for the prompt's whole life."""
        assert proc.stdout is not None
        pending = b""
        while chunk := await proc.stdout.read(4096):
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > 64 or not all(self._answer(line) for line in lines):
                self.kill()
                break
        await proc.wait()
        self._gone = True
        for exit_fut in self._exits.values():  # the jail is gone: its commands will not answer
            if not exit_fut.done():
                exit_fut.set_result(None)

    def _answer(self, line: bytes) -> bool:
        kind, _, rest = line.partition(b" ")
        name, _, code = rest.partition(b" ")
        key = name.decode("ascii", "replace")
        if kind != b"E" or not code.isdigit():
            return False
        exit_fut = self._exits.get(key)
        if exit_fut is not None and not exit_fut.done():
            exit_fut.set_result(int(code))
            return True
        if key in self._unanswered:  # the answer of a command given up on, come late: once
            self._unanswered.discard(key)
            return True
        return False

    def stopped(self) -> bool:
        """The shell is stopped or traced (`kill -STOP $$`), or a stop was sent that it has not yet
        taken (on a busy machine a command sent now would run in a jail about to stop, and be killed
        with it): it would answer nothing until killed."""
        pid = self._shell_pid or self._find_shell()
        if pid is None:
            return False  # not started yet: a shell that has not run cannot have been stopped
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                status = dict(line.split(b":\t", 1) for line in f.read().splitlines() if b":\t" in line)
        except OSError:
            return False
        if status.get(b"State", b"")[:1] in (b"T", b"t"):
            return True
        pending = int(status.get(b"SigPnd", b"0"), 16) | int(status.get(b"ShdPnd", b"0"), 16)
        taken = ~(int(status.get(b"SigBlk", b"0"), 16) | int(status.get(b"SigIgn", b"0"), 16))
        return bool(pending & taken & _STOP_SIGNALS)  # SIGSTOP is never blocked nor ignored

    def _find_shell(self) -> int | None:
        """bwrap → the jail's PID 1 (bwrap's reaper) → the shell; ahead of any orphan the reaper adopts."""
        pid = self.proc.pid if self.proc is not None else None
        for _ in range(3):
            try:
                with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
                    pid = int(f.read().split()[0])
                with open(f"/proc/{pid}/comm", "rb") as f:
                    if f.read().strip() == b"bash":
                        self._shell_pid = pid
                        return pid
            except (OSError, IndexError, ValueError):
                return None
        return None

    def _request(self, argv: list[str], cwd: str, env: dict[str, str]) -> tuple[str, list[bytes]]:
        """A new command's name, and its request's fields."""
        self._count += 1
        inline = len(argv) == 3 and argv[1] == "-c" and argv[0] in ("bash", "sh")  # eval'd in the fork
        fields = [cwd, "eval" if inline else "exec", str(len(env)), *(f"{k}={v}" for k, v in env.items()),
                  *(argv[2:] if inline else argv)]
        if any("\0" in f for f in fields):
            raise ValueError("embedded null byte")
        return str(self._count), [f.encode("utf-8", "surrogateescape") for f in fields]

    async def run(self, argv: list[str], *, cwd: str, env: dict[str, str], timeout: float, limit: int,
                  drain_after_exit: float) -> ExecResult:
        assert self.proc is not None and self.proc.stdin is not None
        name, fields = self._request(argv, cwd, env)
        base = os.path.join(self.ctl, name)
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[int | None] = loop.create_future()
        opened: list[int] = []
        transports: list[asyncio.BaseTransport] = []
        try:
            with open(base + ".req", "xb") as req:
                req.write(b"\0".join(fields) + b"\0")
            streams = []
            for suffix in (".out", ".err"):
                read_end, held = _fifo(base + suffix)
                opened.append(held)
                reader = asyncio.StreamReader()
                pipe, _ = await loop.connect_read_pipe(functools.partial(asyncio.StreamReaderProtocol, reader),
                                                       os.fdopen(read_end, "rb", buffering=0))
                transports.append(pipe)
                streams.append(reader)
            self._exits[name] = exited
            if self._gone:
                exited.set_result(None)
            else:
                self.proc.stdin.write(f"R {name}\n".encode())

            async def wait_exit() -> int:
                while not (await asyncio.wait({exited}, timeout=_WATCH))[0]:
                    if self.stopped():  # the shell was stopped while this command ran: end the jail
                        self.kill()
                code = exited.result()
                return _SHELL_GONE if code is None else code

            async def kill() -> None:
                if self.alive and self.proc is not None and self.proc.stdin is not None:
                    self.proc.stdin.write(f"K {name}\n".encode())

            def release() -> None:  # the command has ended: its output ends when its last writer closes
                while opened:
                    os.close(opened.pop())

            result = await supervise(wait_exit(), kill, streams[0], streams[1], timeout=timeout, limit=limit,
                                     drain_after_exit=drain_after_exit, after_exit=release)
            if exited.done() and exited.result() is None and not result.timed_out:
                if failure := await self._failure():
                    raise SandboxError(f"the prompt's jail failed: {failure}")
                result.stderr += _JAIL_KILLED
            return result
        finally:
            for fd in opened:
                os.close(fd)
            for transport in transports:
                transport.close()
            if not exited.done():
                self._unanswered.add(name)
            self._exits.pop(name, None)
            for suffix in (".req", ".out", ".err"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(base + suffix)

    async def spawn(self, argv: list[str], *, cwd: str, env: dict[str, str]) -> JailProcess:
        """`argv` with its stdin and stdout open to the runner, until it ends or is closed."""
        assert self.proc is not None and self.proc.stdin is not None
        name, fields = self._request(argv, cwd, env)
        base = os.path.join(self.ctl, name)
        loop = asyncio.get_running_loop()
        process = JailProcess(self, name, base)
        try:
            with open(base + ".req", "xb") as req:
                req.write(b"\0".join(fields) + b"\0")
            # its input: a FIFO the jail's user may read, our write end opened while we hold a read end
            os.mkfifo(base + ".in", 0o600)
            held = os.open(base + ".in", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            process.held.append(held)
            os.fchmod(held, 0o644)
            write_end = os.open(f"/proc/self/fd/{held}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                                os.fdopen(write_end, "wb", buffering=0))
            process.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
            readers = []
            for suffix in (".out", ".err"):
                read_end, writer_held = _fifo(base + suffix)
                process.held.append(writer_held)
                reader = asyncio.StreamReader(limit=1 << 24)  # a line of JSON-RPC may be large
                pipe, _ = await loop.connect_read_pipe(functools.partial(asyncio.StreamReaderProtocol, reader),
                                                       os.fdopen(read_end, "rb", buffering=0))
                process.transports.append(pipe)
                readers.append(reader)
            process.stdout = readers[0]
            process.tasks.append(asyncio.ensure_future(process.keep_stderr(readers[1])))
            self._exits[name] = process.exited
            if self._gone:
                process.exited.set_result(None)
            else:
                self.proc.stdin.write(f"R {name}\n".encode())
            process.tasks.append(asyncio.ensure_future(process.release_when_ended()))
        except BaseException:
            await process.close()
            raise
        return process

    async def _failure(self) -> str:
        """What bubblewrap said when the jail would not start (the shell's own stderr is silenced)."""
        if self.proc is None or self.proc.stderr is None:
            return ""
        with contextlib.suppress(TimeoutError, OSError):
            return (await asyncio.wait_for(self.proc.stderr.read(2000), 1.0)).decode(errors="replace").strip()
        return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            kill_group(self.proc.pid)  # bwrap; the jail dies with it (--die-with-parent, its PID 1 gone)

    async def _close_egress(self) -> None:
        stop, self._egress_stop = self._egress_stop, None
        if stop is not None:
            await stop()

    async def close(self, *, at_once: bool = False) -> None:
        """End the jail and wait until it is gone: the shell ends at the end of its input, bwrap's
        PID 1 with it, and the kernel kills the rest. Removing the prompt's directories while the
        jail's mounts still stand would make the kernel detach them one by one, under its global
        mount lock (it did: a fifth of a worker's time at 200 prompts in flight)."""
        if self.proc is None:
            return
        if self._info >= 0:
            os.close(self._info)
            self._info = -1
        await self._close_egress()
        if at_once:
            self.kill()
        elif self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), _CLOSE_GRACE)
        except TimeoutError:  # the shell was stopped (`kill -STOP`): bwrap takes the jail down with it
            self.kill()
            await self.proc.wait()


async def _jail_pid(info: int) -> int | None:
    """The jail's first process, as bwrap's --info-fd names it (None: bwrap ended without one).
    Reads and closes `info`."""
    reader = asyncio.StreamReader()
    pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
        functools.partial(asyncio.StreamReaderProtocol, reader), os.fdopen(info, "rb", buffering=0))
    try:
        data = await reader.read(65536)
        while chunk := await reader.read(65536):
            data += chunk
    finally:
        pipe.close()
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


class JailProcess(Process):
    """A command of a prompt's jail spawned with its stdin open (JailShell.spawn)."""

    def __init__(self, shell: JailShell, name: str, base: str):
        super().__init__()
        self.shell, self.name, self.base = shell, name, base
        self.exited: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.stdin: asyncio.StreamWriter | None = None
        self.held: list[int] = []  # FIFO ends the runner holds open while the command runs
        self.transports: list[asyncio.BaseTransport] = []
        self.tasks: list[asyncio.Future[Any]] = []
        self._closed = False

    def write(self, data: bytes) -> None:
        if self.stdin is None or self.stdin.is_closing():
            raise BrokenPipeError("the command's standard input is closed")
        self.stdin.write(data)

    async def drain(self) -> None:
        if self.stdin is not None:
            await self.stdin.drain()

    async def wait(self) -> int | None:
        return await asyncio.shield(self.exited)

    async def release_when_ended(self) -> None:
        """Once it has ended, its output ends with its last writer: the ends the runner held go."""
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self.exited)
        while self.held:
            os.close(self.held.pop())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        shell = self.shell
        if not self.exited.done() and shell.alive and shell.proc is not None and shell.proc.stdin is not None:
            # its process group, the waiter that would answer with it: no answer comes
            shell.proc.stdin.write(f"K {self.name}\n".encode())
        if not self.exited.done():
            self.exited.set_result(-signal.SIGKILL)
        shell._exits.pop(self.name, None)
        if self.stdin is not None:
            self.stdin.close()
        for transport in self.transports:
            transport.close()
        for task in self.tasks:
            task.cancel()
        while self.held:
            os.close(self.held.pop())
        for suffix in (".req", ".in", ".out", ".err"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.base + suffix)


def _fifo(path: str) -> tuple[int, int]:
    """A FIFO the jail's user may write: our read end, and a write end we hold until the command
    ends (so that reading sees no end of file before the command has even opened it)."""
    os.mkfifo(path, 0o600)
    read_end = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISFIFO(os.fstat(read_end).st_mode):
        os.close(read_end)
        raise SandboxError(f"{path} is not the FIFO the runner made")
    os.fchmod(read_end, 0o622)
    return read_end, os.open(f"/proc/self/fd/{read_end}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)


class LocalSandbox(ShellSandbox):
    """Files move through `exec` (ShellSandbox's read/write), as the jail's user and in the jail's
    view: the runner, perhaps root, never resolves a path the prompt could have planted a link in."""

    def __init__(self, top: Path, settings: BackendSettings, jail: Jail | None, disks: Disks, owner: int,
                 egress: Egress | None = None):
        self.top = top
        self.jail = jail
        self.egress = egress if jail is not None and settings.network else None
        self.owner = owner
        self.disks = disks
        self.output_limit = settings.output_limit
        self.session_parallelism = settings.session_parallelism
        self.shell = "bash" if shutil.which("bash") else "sh"
        self._groups: set[int] = set()
        self._shell: JailShell | None = None
        self._shell_lock = asyncio.Lock()
        self._replaced = False  # the next command runs in a jail that replaced a stopped one
        self.env = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
        if jail is not None:  # the same view as a container's; the agent's own variables come per command
            self.workdir, self.scratch = CONTAINER_WORKDIR, "/tmp"
            self.driver_dir = DRIVER_MOUNT if settings.driver_dir else None
            self.harness_dir = HARNESS_MOUNT if settings.harness_dir else None
            self.env.update(RUNNER_ENV, PATH=_JAIL_PATH)  # the runner's PATH may point into hidden places
            if self.egress is not None:
                self.network_env = egress_env()
            self.trusted_path = _JAIL_PATH  # the host's system directories, read-only in the jail
            self.agent_writable = ("/tmp", "/var/tmp", "/dev/shm")
        else:
            self.workdir, self.scratch = os.path.realpath(top / "work"), os.path.realpath(top / "tmp")
            self.driver_dir = settings.driver_dir  # no isolation: the driver where it lies
            self.harness_dir = settings.harness_dir
            self.check_parent = self.scratch
            site = os.path.join(self.scratch, "site-packages")
            self.env.setdefault("PATH", _JAIL_PATH)
            self.env.update(HOME=self.workdir, TMPDIR=self.scratch, PYTHONUNBUFFERED="1", PIP_TARGET=site,
                            PYTHONPATH=site, PIP_DISABLE_PIP_VERSION_CHECK="1")

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        self.check_open()
        argv = await self._code_argv(code, language, self.shell)
        cwd = cwd or self.workdir
        limit = output_limit or self.output_limit
        if self.jail is not None:
            shell, replaced = await self._jail_shell()
            result = await shell.run(argv, cwd=cwd, env=self.command_env(env, runner), timeout=timeout, limit=limit,
                                     drain_after_exit=_PIPE_DRAIN_AFTER_EXIT)
            if replaced:
                result.stderr = _JAIL_REPLACED + result.stderr
            return result
        # unjailed, the group outlives the command when it leaves background jobs: killed at close
        return await run_process(argv, cwd=cwd, env={**self.env, **(env or {})}, timeout=timeout,
                                 limit=limit, on_start=self._groups.add, drain_after_exit=_PIPE_DRAIN_AFTER_EXIT)

    async def spawn(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        self.check_open()
        if self.jail is None:
            return await spawn_process(argv, cwd=cwd or self.workdir, env={**self.env, **(env or {})},
                                       on_start=self._groups.add)
        shell, _ = await self._jail_shell()
        return await shell.spawn(argv, cwd=cwd or self.workdir, env=self.command_env(env, False))

    async def network_pid(self) -> int | None:
        if self.jail is None:
            return None  # unisolated: the host's own network
        shell, _ = await self._jail_shell()
        return await shell.jail_pid()

    async def _jail_shell(self) -> tuple[JailShell, bool]:
        """The prompt's jail, made at its first command and made again if something killed or
        stopped its shell (and whether this command is the first after a stopped one)."""
        async with self._shell_lock:
            self.check_open()
            replaced = False
            if self._shell is None or not self._shell.alive or self._shell.stopped():
                if self._shell is not None:
                    replaced = self._shell.alive  # alive, yet stopped
                    await self._shell.close(at_once=True)
                assert self.jail is not None
                self._shell = JailShell(self.jail, str(self.top), self.env, self.owner, self.egress)
                await self._shell.start()
            return self._shell, replaced

    async def end_processes(self) -> None:
        """The jail ends, and everything in it; the next command gets a new one (files kept)."""
        self.check_open()
        async with self._shell_lock:
            if self._shell is not None:
                await self._shell.close()
                self._shell = None
        if self.jail is None:  # until none is left: a killed process may take a moment to go
            for _ in range(50):
                for pgid in self._groups:
                    kill_group(pgid)
                if not await asyncio.to_thread(_kill_tagged, self.top):
                    break
                await asyncio.sleep(0.02)
            self._groups.clear()

    async def close(self) -> None:
        if not self.mark_closed():
            return
        async with self._shell_lock:
            if self._shell is not None:
                await self._shell.close()
        for pgid in self._groups:
            kill_group(pgid)
        if self.jail is None:
            await asyncio.to_thread(_kill_tagged, self.top)
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        self.disks.release(self.top)
        remove_tree(Path(control_dir(str(self.top))))


def _kill_tagged(top: Path) -> int:
    """Unjailed: processes that left the command's group (`setsid cmd &`) still have the sandbox's
    TMPDIR in their environment; find them by it and kill them. How many were found."""
    tag = f"TMPDIR={os.path.realpath(top / 'tmp')}".encode()
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    os.kill(int(entry), 9)
                    found += 1
        except (OSError, ProcessLookupError):
            continue
    return found


class LocalBackend(HostDirectories):
    name = "local"
    starts_cheaply = True  # a directory (and, as root, a small filesystem)
    Settings = LocalSettings
    settings: LocalSettings

    def __init__(self, settings: LocalSettings):
        super().__init__(settings)
        self.jail = (Jail(settings.network, settings.pids_limit, settings.driver_dir, settings.harness_dir)
                     if settings.local_isolation == "bwrap" else None)

    async def setup(self) -> None:
        await self.prepare_directories()
        if self.jail is not None:
            # a live jail holds three pipes and a pidfd, a running command four FIFO ends: hundreds
            # of loops need more than the usual soft limit of 1024 descriptors
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            wanted = 65536 if hard == resource.RLIM_INFINITY else hard
            if soft != resource.RLIM_INFINITY and soft < wanted:
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            probe = self.root / f".probe-{os.getpid()}-{secrets.token_hex(3)}"
            try:
                await asyncio.to_thread(self.jail.check, probe)
            finally:
                shutil.rmtree(probe, ignore_errors=True)
        self.notes = self._notes()

    def _notes(self) -> list[str]:
        notes = self.disks.note()
        if self.jail is None:
            notes.insert(0, "warning: --local_isolation=none: model-written code runs on this host as your user, with "
                            "no isolation (it can read your files and other processes); use it only on a disposable machine")
        # a uid per prompt caps its processes as root; memory and CPU would need cgroups
        unapplied = ("memory", "cpus") if self.jail is not None and self.jail.as_root else ("memory", "cpus", "pids_limit")
        fields = type(self.settings).model_fields
        ignored = [f"--{flag}" for flag in unapplied if getattr(self.settings, flag) != fields[flag].default]
        if ignored:
            notes.append(f"note: the local backend does not apply {', '.join(ignored)} (no cgroups); "
                         "use --backend=docker or singularity for resource limits")
        return notes

    async def start(self, spec: SandboxSpec) -> LocalSandbox:
        name = f"{hashlib.sha1(spec.prompt_id.encode()).hexdigest()[:12]}-{secrets.token_hex(3)}"
        top = self.root / name
        owner = self.jail.owner() if self.jail is not None else os.geteuid()
        os.mkdir(top, 0o700)  # the runner's alone: the prompt sees only the `work` and `tmp` in it
        try:
            self.disks.make(top, owner)
        except OSError as exc:
            os.rmdir(top)
            raise SandboxError(f"cannot make the prompt's directory: {exc}") from exc
        sandbox = LocalSandbox(top, self.settings, self.jail, self.disks, owner, self.egress)
        sandbox.task_env = dict(spec.env)
        return sandbox

    async def sweep_orphans(self) -> int:
        """Remove sandboxes that an earlier, crashed run with this label left behind (none of this
        run's workers is running while this runs: it is called before and after them)."""
        if not self.root.is_dir():
            return 0
        self.disks.sweep()
        leftovers = [p for p in self.root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]
        for p in leftovers:
            remove_tree(p)
        return sum(1 for p in leftovers if not p.name.endswith(".ctl"))

