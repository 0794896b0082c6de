"""Docker backend: one hardened container per prompt, commands run with `docker exec`.

The container sleeps while the agent works and is removed (with its anonymous volume) when the
prompt ends. Root is read-only; the work directory is an anonymous volume (so an image's own files
at that path stay visible and writable) and /tmp is a tmpfs of `--disk` bytes (memory, within the
container's `--memory`); the volume is bounded only by the engine's disk. Every container carries the run's
labels, so `sweep_orphans` can remove what a crashed run left. The docker SDK blocks, so every call
runs in this backend's own thread pool and never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..util import parse_size
from .base import (
    CONTAINER_WORKDIR,
    DRIVER_MOUNT,
    HARNESS_MOUNT,
    KILL_GRACE,
    RUNNER_ENV,
    TIMEOUT_EXIT_CODE,
    BackendSettings,
    BaseBackend,
    BoundedBuffer,
    ExecResult,
    ImageUnavailable,
    Language,
    OncePerKey,
    Process,
    SandboxEnvironment,
    SandboxError,
    SandboxExhausted,
    SandboxSpec,
    ShellSandbox,
    decode,
    killed_by_timeout,
    under_any,
)
from .egress import egress_env, listener_inside

SDK_MISSING: str | None = None  # the `docker` extra; without it this module (and its flags) still loads
try:
    import docker
    from docker.errors import APIError, BuildError, DockerException, ImageNotFound, NotFound
    from docker.types import Mount
except ImportError as exc:
    SDK_MISSING = exc.name

LABEL = "hermes-batch"
# seconds a command's output is still read after it exited (a background job may hold it open for
# ever): a reader starved on a loaded machine lost the output of commands that had ended at 1 s
EXITED_GRACE = 3.0
KEEPER_USER = "2000000000:2000000000"  # no image's user: the container's init and keeper run as it
SCRATCH = "/tmp/.hermes-batch"
# where a container sees its image's home as the image has it, read-only (a volume of the run's,
# filled from the image once): each check's HOME is a fresh copy of it, never the agent's
PRISTINE_HOME = "/.hermes-batch-image-home"
# mounted in every container: the image's home needs none of them to be written
TMPFS = ("/tmp", "/run", "/var/tmp", "/logs", "/tests", "/solution")
# What a root image's own processes (its ENTRYPOINT, the check) hold, as under Harbor: Docker's
# defaults less NET_RAW, MKNOD, SYS_CHROOT and SETFCAP. The agent's commands hold none of them.
IMAGE_ROOT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
                   "NET_BIND_SERVICE", "AUDIT_WRITE")
# held only by what the image's ENTRYPOINT started: the runner's commands and the check go without
# it, the agent's without any, so `end_processes` can tell the image's services from the agent's
STARTED_BY_IMAGE = 29  # CAP_AUDIT_WRITE: nothing here needs it
ENTRYPOINT_LOG = f"{SCRATCH}/entrypoint.log"
_KEEPER_ID = KEEPER_USER.split(":")[0]
# the keeper (uid not root: it holds no capability) keeps the image's mark in its bounding set, so
# ending the agent's processes spares it by that alone, not by its user (which a check can take)
KEEPER_SETPRIV = [f"--reuid={_KEEPER_ID}", f"--regid={_KEEPER_ID}", "--clear-groups", "--inh-caps=-all",
                  "--bounding-set=-all,+audit_write"]
# PID 1 of a container whose root keeps its capabilities: as the keeper user (root could signal a
# root PID 1, and an init's child, out of the container), reaping the orphans it is handed
KEEPER = 'trap "" HUP INT QUIT TERM USR1 USR2; while :; do sleep 3600 & wait; done'
HARBOR_COMMAND = ["sh", "-c", "sleep infinity"]  # what Harbor hands an image's ENTRYPOINT
# gVisor's kernel runs as host threads in the container's cgroup, about two for each process of the
# sandbox's and some of its own: at --pids_limit a busy sandbox's next one could not be made and
# gVisor ended the container (Go's "failed to create new OS thread")
GVISOR_THREADS_PER_PROCESS, GVISOR_THREADS = 3, 256


@dataclass(frozen=True)
class ImageFacts:
    """What an image's configuration says, read once per image."""

    workdir: str | None  # its WORKDIR (inherited ones count); None for none or "/"
    user: str  # its USER: the user its commands run as
    env: dict[str, str]
    entrypoint: tuple[str, ...]
    # its commands' HOME, as Docker gives it: its ENV's, else its user's in its own /etc/passwd
    # (None: none but "/", where the commands keep the writable /tmp)
    home: str | None = None

    @property
    def runs_as_root(self) -> bool:
        return self.user.split(":", 1)[0] in ("", "0", "root")


class DockerSandbox(ShellSandbox):
    own_pid_namespace = True
    own_root = True
    # the init and its `sleep infinity` run as KEEPER_USER: the prompt's commands can neither signal
    # them nor write their memory (a review turned the spared keeper into a loop that forged results)
    others_are_keepers = True
    # its mounts (the work directory is one too); the root is read-only
    agent_writable: tuple[str, ...] | None = (*TMPFS, "/dev/shm")
    agent_prefix: list[str]  # what the agent's commands run under (`as_image_root`)
    runner_prefix: list[str]  # what the runner's own commands and the checks run under
    egress_stop: Callable[[], Awaitable[None]] | None = None  # --network: ends its way out (egress.py)

    async def end_processes(self) -> None:
        failed: SandboxError | None = None
        try:
            await super().end_processes()
        except SandboxExhausted:
            raise
        except SandboxError as exc:
            failed = exc
        state = await self.backend.run_blocking(self._state)
        for _ in range(10 if failed is not None else 0):  # an ending container: the engine says why a moment later
            if state.get("OOMKilled") or not state.get("Running") or "stopped state" not in str(failed):
                break
            await asyncio.sleep(0.5)
            state = await self.backend.run_blocking(self._state)
        if state.get("OOMKilled"):
            raise SandboxExhausted(f"the container used up its --memory={self.backend.settings.memory} (files in "
                                   "/tmp and /dev/shm count against it) and was ended")
        if not state.get("Running"):  # seen under gVisor (runsc): the engine ends the container
            raise SandboxError(f"the container ended (exit code {state.get('ExitCode')}) while the prompt's "
                               "processes were ended")
        if failed is not None and "OCI runtime exec failed" in str(failed):
            # the container runs, but runc's own start of the command was killed: the agent's root can
            # signal it (a job that kills every process it may, for ever), so this is the agent's doing
            raise SandboxExhausted("the runner's command could not start in the running container: something the "
                                   f"agent left kills processes as they start ({failed})") from failed
        if failed is not None:
            raise failed

    def start_notes(self) -> list[str]:
        said = super().start_notes()
        if self.root_refused:
            said.append(f"{self.root_refused}, so its ENTRYPOINT, the agent and the checks all run without root's "
                        "capabilities: an entrypoint or a check that needs them (su, chown) fails (docs/backends.md)")
        return said

    def as_image_root(self, setpriv: str) -> None:
        """The image's user is root and keeps its capabilities (Harbor's way) for the image's own
        processes; the agent's commands go without any (they cannot gain one back: no_new_privs),
        the runner's and the check's without the one that marks the image's."""
        self.agent_prefix = [setpriv, "--inh-caps=-all", "--bounding-set=-all"]
        self.runner_prefix = [setpriv, "--bounding-set=-audit_write"]
        self.started_by_sandbox = STARTED_BY_IMAGE

    async def bounding_sets(self) -> tuple[int, int]:
        """The capability bounding sets the agent's and the runner's commands get here."""
        read = 'while read -r k a _; do [ "$k" = CapBnd: ] && { echo "$a"; exit 0; }; done < /proc/self/status; exit 1'
        found = []
        for runner in (False, True):
            for _ in range(3):  # a loaded engine has returned an exec's exit 0 without its output
                res = await self.exec(read, timeout=30, runner=runner, cwd="/")
                if res.exit_code == 0 and re.fullmatch(r"[0-9a-fA-F]+", res.stdout.strip()):
                    found.append(int(res.stdout.strip(), 16))
                    break
            else:
                raise SandboxError(f"cannot read a command's capabilities (exit {res.exit_code}): "
                                   f"{res.stderr.strip() or res.stdout.strip() or 'no output'}")
        return found[0], found[1]

    async def start_entrypoint(self, facts: ImageFacts, env: dict[str, str]) -> None:
        """The image's ENTRYPOINT, as Harbor starts it (with `sh -c "sleep infinity"`), as the image's
        user with its capabilities; what it starts keeps running beside the agent and the check.
        One that ends at once with an error fails the sandbox's start, saying what it printed."""
        wrap = f'mkdir -p {SCRATCH} && exec "$0" "$@" > {ENTRYPOINT_LOG} 2>&1'
        argv = ["/bin/sh", "-c", wrap, *facts.entrypoint, *HARBOR_COMMAND]

        def launch() -> str:
            exec_id: str = self.api.exec_create(self.id, argv, workdir=self.workdir, environment=env, user=self.user)["Id"]
            self.api.exec_start(exec_id, detach=True)
            return exec_id

        try:
            exec_id = await self.backend.run_blocking(launch)
        except (NotFound, APIError) as exc:
            raise self._failed(exc, "cannot start the image's ENTRYPOINT") from exc
        for _ in range(5):  # a few tenths of a second: one that fails at once says so here
            await asyncio.sleep(0.05)
            info = await self.backend.run_blocking(self.api.exec_inspect, exec_id)
            if info.get("Running"):
                continue
            if info.get("ExitCode"):
                said = await self._sh(f"tail -c 1500 {ENTRYPOINT_LOG}", timeout=30)
                raise SandboxError(f"the image's ENTRYPOINT {' '.join(facts.entrypoint)} ended at its start (exit code "
                                   f"{info.get('ExitCode')}); it said: {said.stdout.strip() or 'nothing'}")
            return

    async def ended_at_start(self) -> str | None:
        def why() -> str | None:
            state = self._state()
            if not state or state.get("Running"):
                return None
            try:
                said = decode(self.api.logs(self.id, stdout=True, stderr=True, tail=40)).strip()
            except (NotFound, APIError):
                said = ""
            entrypoint = ((self.api.inspect_container(self.id).get("Config") or {}).get("Entrypoint") or [])
            return (f"the container ended at its start (exit code {state.get('ExitCode')})"
                    + (f"; its ENTRYPOINT {' '.join(entrypoint)} runs here as an unprivileged user of the runner's, "
                       "with no capabilities (docs/backends.md)" if entrypoint else "")
                    + (f"; it said: {said[-1500:]}" if said else "; it said nothing"))

        try:
            return await self.backend.run_blocking(why)
        except (NotFound, APIError):
            return None

    def _state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = self.api.inspect_container(self.id)["State"]
            return state
        except (NotFound, APIError):
            return {}

    def _failed(self, exc: Exception, what: str) -> SandboxError:
        """An exec the engine refused: the sandbox's memory used up (the agent's doing), or the sandbox failed."""
        if self._state().get("OOMKilled"):
            return SandboxExhausted(f"the container used up its memory and was ended ({what})")
        return SandboxError(f"{what}: {getattr(exc, 'explanation', None) or exc}")

    def __init__(self, backend: DockerBackend, container_id: str, workdir: str, user: str = "0",
                 home: tuple[str | None, bool, bool] = (None, False, False)):
        self.root_refused: str | None = None  # why its root could not keep its capabilities, as it was to
        self.agent_prefix = self.runner_prefix = []  # what the agent's commands and the runner's run under
        self.backend = backend
        self.user = user  # the image's own user: what the prompt's commands run as
        self.api = backend.client.api
        self.id = container_id
        self.workdir = workdir
        self.scratch = SCRATCH
        self.driver_dir = DRIVER_MOUNT if backend.settings.driver_dir else None
        self.harness_dir = HARNESS_MOUNT if backend.settings.harness_dir else None
        # the image's home: the agent's commands' HOME (a volume over it when the root is read-only, so
        # they write it as under Harbor); each check's HOME a copy of it as the image has it
        self.image_home, self.home_writable, pristine = home
        self.pristine_home = PRISTINE_HOME if pristine else None
        if self.home_writable and self.image_home:
            self.agent_writable = (*TMPFS, "/dev/shm", self.image_home)
        if not backend.settings.read_only_root:
            self.agent_writable = None  # the whole root is the agent's to change
        self.output_limit = backend.settings.output_limit
        self.session_parallelism = backend.settings.session_parallelism

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        self.check_open()
        argv = await self._timed_argv(code, language, timeout, self.runner_prefix if runner else self.agent_prefix)
        return await self.backend.run_blocking(
            self._exec_blocking, argv, cwd or self.workdir, self.command_env(env, runner),
            output_limit or self.output_limit, timeout,
        )

    async def network_pid(self) -> int | None:
        if self.backend.settings.runtime:  # gVisor's network is its own stack's, not a namespace of this machine's
            return None
        pid = int((await self.backend.run_blocking(self._state)).get("Pid") or 0)
        return pid if pid > 0 and os.path.exists(f"/proc/{pid}/ns/net") else None

    async def spawn(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        self.check_open()

        def start() -> tuple[str, Any]:
            try:
                exec_id = self.api.exec_create(self.id, [*self.agent_prefix, *argv], workdir=cwd or self.workdir,
                                               environment=self.command_env(env, False), stdin=True, stdout=True,
                                               stderr=True, user=self.user)["Id"]
                return exec_id, ExecOutput.start(self.api, exec_id)
            except NotFound as exc:
                raise self._failed(exc, f"container {self.id[:12]} is gone") from exc
            except APIError as exc:
                raise self._failed(exc, "docker exec failed") from exc

        exec_id, output = await self.backend.run_blocking(start)
        if not isinstance(output, ExecOutput):  # an engine reached otherwise than by a socket of this machine
            output.close()
            raise SandboxError("a command's standard input cannot be kept open through this Docker engine's connection")
        return DockerProcess(self, exec_id, output)

    def _exec_blocking(self, argv, cwd, env, limit, timeout) -> ExecResult:
        started = time.monotonic()
        try:
            exec_id = self.api.exec_create(self.id, argv, workdir=cwd, environment=env, stdout=True, stderr=True,
                                           user=self.user)["Id"]
            stream = ExecOutput.start(self.api, exec_id)
        except NotFound as exc:
            raise self._failed(exc, f"container {self.id[:12]} is gone") from exc
        except APIError as exc:
            raise self._failed(exc, "docker exec failed") from exc
        out, err = BoundedBuffer(limit), BoundedBuffer(limit)
        cut_off = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(exec_id, stream, started, timeout, cut_off), daemon=True)
        watcher.start()
        try:
            for stdout, stderr in stream:
                if stdout:
                    out.feed(stdout)
                if stderr:
                    err.feed(stderr)
        except Exception:
            if not cut_off.is_set():
                raise
        finally:
            cut_off.set()
            stream.close()
        try:
            info = self.api.exec_inspect(exec_id)
        except NotFound as exc:  # the engine dropped the exec with its container (seen under gVisor)
            raise self._failed(exc, "the container ended while a command ran") from exc
        elapsed = time.monotonic() - started
        code = info.get("ExitCode")
        timed_out = killed_by_timeout(code, elapsed, timeout) or (info.get("Running") and elapsed >= timeout)
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else -1),
            stdout=decode(out.getvalue()), stderr=decode(err.getvalue()),
            duration=elapsed, timed_out=bool(timed_out),
        )

    def _watch(self, exec_id, stream, started, timeout, done: threading.Event) -> None:
        """Stop reading when the command has exited but a background job still holds its output
        open, or when even `timeout` failed to end it."""
        hard_deadline = started + timeout + KILL_GRACE + 5
        exited_at = None
        while not done.wait(1.0 if time.monotonic() - started > 2 else 0.25):
            now = time.monotonic()
            if now > hard_deadline:
                break
            if now - started < 2:
                continue
            try:
                running = self.api.exec_inspect(exec_id).get("Running")
            except Exception:
                break
            if not running:
                exited_at = exited_at or now
                if now - exited_at >= EXITED_GRACE:
                    break
        if not done.is_set():
            done.set()
            stream.close()

    async def close(self) -> None:
        if not self.mark_closed():
            return
        stop, self.egress_stop = self.egress_stop, None
        if stop is not None:
            await stop()
        await self.backend.remove(self.id)


class DockerProcess(Process):
    """An exec with its stdin attached: written through the engine's socket, its output read from
    it in a thread of its own (frames, as ExecOutput reads them)."""

    def __init__(self, sandbox: DockerSandbox, exec_id: str, output: ExecOutput):
        super().__init__()
        self.sandbox, self.exec_id, self.output = sandbox, exec_id, output
        self.stdout = asyncio.StreamReader(limit=1 << 24)  # a line of JSON-RPC may be large
        self._pending = bytearray()
        self._sock = output._reader.raw._sock
        loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[None] = loop.create_future()
        self._closed = False
        threading.Thread(target=self._read, args=(loop,), daemon=True, name="docker-process").start()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            for out, err in self.output:
                if out:
                    loop.call_soon_threadsafe(self.stdout.feed_data, out)
                if err:
                    self._stderr.feed(err)
        except Exception:
            pass  # its connection went: it has ended, as far as the runner can tell
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed since
                loop.call_soon_threadsafe(self._end)

    def _end(self) -> None:
        self.stdout.feed_eof()
        if not self._ended.done():
            self._ended.set_result(None)

    def write(self, data: bytes) -> None:
        if self._closed:
            raise BrokenPipeError("the command's standard input is closed")
        self._pending += data

    async def drain(self) -> None:
        data, self._pending = bytes(self._pending), bytearray()
        if data:
            await self.sandbox.backend.run_blocking(self._sock.sendall, data)

    async def wait(self) -> int | None:
        await asyncio.shield(self._ended)
        try:
            info = await self.sandbox.backend.run_blocking(self.sandbox.api.exec_inspect, self.exec_id)
        except (NotFound, APIError):
            return None
        code = info.get("ExitCode")
        return code if isinstance(code, int) else None

    async def close(self) -> None:
        """Its stdin and output closed: what reads its stdin ends (an MCP server does), and what it
        left ends with the prompt's processes, before a check and with the container."""
        if not self._closed:
            self._closed = True
            self.output.close()


class ExecOutput:
    """A started exec's stdout and stderr, as (stdout, stderr) pairs of which one is None.

    Read through the buffer the upgrade's headers were read with: the SDK's own stream reads the
    socket beneath it, and what came in the same read (all a quick command said, on a loaded
    machine) stayed in that buffer, lost (docker-py 7: `_get_raw_response_socket`)."""

    STDOUT, STDERR = 1, 2  # the engine's frame header: stream, 3 zero bytes, length (big-endian)

    def __init__(self, response: Any):
        self._response = response
        self._reader = response.raw._fp.fp  # http.client's buffered reader over the engine's socket

    @classmethod
    def start(cls, api: Any, exec_id: str) -> Any:
        """The exec started, its output to read; through the SDK's own stream where the engine is
        reached another way than a socket of this machine's (ssh, a Windows pipe)."""
        if api.base_url.startswith(("http+docker://ssh", "http+docker://localnpipe")):
            return api.exec_start(exec_id, stream=True, demux=True)
        response = api._post_json(api._url("/exec/{0}/start", exec_id), data={"Tty": False, "Detach": False},
                                  headers={"Connection": "Upgrade", "Upgrade": "tcp"}, stream=True)
        api._raise_for_status(response)
        api._disable_socket_timeout(response.raw._fp.fp.raw)  # a command may say nothing for longer than a call may take
        return cls(response)

    def __iter__(self):
        while len(header := self._reader.read(8)) == 8:
            kind, length = header[0], struct.unpack(">I", header[4:])[0]
            data = self._reader.read(length)
            if kind in (self.STDOUT, self.STDERR):
                yield (data, None) if kind == self.STDOUT else (None, data)
            if len(data) < length:
                return

    def close(self) -> None:
        """Ends a read under way too (from another thread): the socket is shut before it is closed."""
        try:
            self._reader.raw._sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self._response.close()


class DockerBackend(BaseBackend):
    name = "docker"
    uses_images = True
    builds_images = True

    def __init__(self, settings: BackendSettings):
        super().__init__(settings)
        self.client: Any = None  # docker.DockerClient, once setup() connected
        self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="docker")
        self._image_checks = OncePerKey()
        self._images: dict[str, ImageFacts | None] = {}  # what each image's configuration says (None: not here)
        # image → the setpriv that keeps its root's capabilities from the agent (None: it has none)
        self._root_setpriv: dict[str, str | None] = {}
        self._root_refusals: dict[str, str] = {}  # image → why its root could not keep its capabilities
        self._root_proven: set[str] = set()  # images whose agent's commands were seen to go without capabilities
        self.pids_headroom = 0  # host threads of the runtime's own within a container's process limit (gVisor's)
        self._environments: dict[Any, SandboxEnvironment] = {}  # (image, workdir) → what its probe said
        self._volumes: list[str] = []  # the images' homes as they have them (PRISTINE_HOME), removed at finish_run

    async def run_blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def setup(self) -> None:
        def connect():
            client = docker.from_env(timeout=120, max_pool_size=128)
            client.ping()
            return client

        try:
            self.client = await self.run_blocking(connect)
        except DockerException as exc:
            raise SandboxError(f"cannot reach the Docker engine ({exc}); is dockerd running and DOCKER_HOST right?") from exc
        gvisor = False
        if self.settings.runtime:
            runtimes = (await self.run_blocking(self.client.info)).get("Runtimes") or {}
            path = str((runtimes.get(self.settings.runtime) or {}).get("path") or self.settings.runtime)
            gvisor = path.rsplit("/", 1)[-1].startswith("runsc")
            if gvisor:
                limit = self.settings.pids_limit
                self.pids_headroom = (GVISOR_THREADS_PER_PROCESS - 1) * limit + GVISOR_THREADS
                self.notes.append(f"gVisor ({self.settings.runtime}): its own threads count against a container's "
                                  f"process limit, so each is given {limit + self.pids_headroom} (--pids_limit={limit} "
                                  "for the commands' processes and room for gVisor's); one that forks past that ends")
        if self.settings.network:
            self._check_egress(gvisor)

    def _check_egress(self, gvisor: bool) -> None:
        """--network gives each container a network of its own whose one way out the runner places in
        it from this machine (egress.py): refused where that cannot be done, saying why."""
        why = ""
        if gvisor:  # runsc --network=none: gVisor's own stack, off; no namespace of the host's to place it in
            why = (f"the runtime {self.settings.runtime} is gVisor run with its network off (its own network stack "
                   "fails on this kernel: google/gvisor#10704), so nothing can be placed in a container's network")
        elif not self.client.api.base_url.startswith("http+docker://localhost"):
            why = f"the Docker engine at {self.client.api.base_url} is not reached through a socket of this machine"
        if why:
            raise SandboxError(f"--network cannot be given here: {why}. Each container has a network of its own, "
                               "whose one way out the runner places in it from this machine: use runc on a Docker "
                               "engine of this machine, or run without --network")

    async def prepare_image(self, image: str | None) -> str:
        """Inspect each image once, pull it if missing; concurrent callers share one check."""
        image = image or self.settings.image
        await self._image_checks(image, lambda: self.run_blocking(self._ensure_image, image))
        return image

    async def build_image(self, context: str, tag: str) -> bool:
        """Once per tag: an image named by its directory's content is built at most once."""
        built: bool = await self._image_checks(("build", tag), lambda: self.run_blocking(self._build, context, tag))
        return built

    def _build(self, context: str, tag: str) -> bool:
        try:
            self.client.images.get(tag)
            return False
        except ImageNotFound:
            pass
        try:
            self.client.images.build(path=context, tag=tag, rm=True, forcerm=True, pull=False,
                                     labels={LABEL: "1", f"{LABEL}.built-from": context})
            return True
        except BuildError as exc:
            said = "".join(str(part.get("stream") or part.get("error") or "") for part in exc.build_log)
            raise ImageUnavailable(f"could not build {tag} from {context}/Dockerfile: {exc.msg}\n{said[-2000:]}") from exc
        except (APIError, DockerException) as exc:
            raise ImageUnavailable(f"could not build {tag} from {context}/Dockerfile: "
                                   f"{getattr(exc, 'explanation', None) or exc}") from exc

    def _ensure_image(self, image: str) -> None:
        try:
            self.client.images.get(image)
            return
        except ImageNotFound:
            pass
        except APIError as exc:
            raise ImageUnavailable(f"cannot inspect image {image}: {exc.explanation or exc}") from exc
        try:
            self.client.images.pull(image)
        except (APIError, DockerException) as exc:
            detail = getattr(exc, "explanation", None) or str(exc)
            raise ImageUnavailable(f"image {image} is not on this Docker engine and could not be pulled: {detail}") from exc

    async def start(self, spec: SandboxSpec) -> DockerSandbox:
        image = spec.image or self.settings.image
        if image not in self._images:  # as its configuration says (not its Dockerfile's text)
            self._images[image] = await self.run_blocking(self._image_facts, image)
        facts = self._images[image] or ImageFacts(None, "0", {}, ())  # (the create that follows says what is wrong)
        wanted = facts.runs_as_root and (spec.image_root or self.settings.image_root == "always")
        wanted = wanted and self.settings.image_root != "never"
        if wanted and image not in self._root_setpriv:  # its first: a sandbox of nothing but a probe says if it has setpriv
            first = await self._start(image, spec, facts, None, probe_only=True)
            self._root_setpriv[image] = first.setpriv
            if not first.setpriv:
                self._root_refusals[image] = "it has no util-linux setpriv that can take capabilities from the agent's commands"
            await first.close()
        setpriv = self._root_setpriv.get(image) if wanted else None
        sandbox = await self._start(image, spec, facts, setpriv)
        sandbox.root_refused = self._root_refusals.get(image) if wanted and not setpriv else None
        if not setpriv:
            return sandbox
        try:
            sandbox.as_image_root(setpriv)
            if image not in self._root_proven:  # make sure the agent's commands go without capabilities
                agent, runner = await sandbox.bounding_sets()
                userns = await sandbox.exec("grep -q '^Seccomp:[[:space:]]*0' /proc/self/status && exit 0; "
                                            "command -v unshare >&- || exit 1; unshare -U true", timeout=30, cwd="/")
                if agent != 0 or not runner or runner & (1 << STARTED_BY_IMAGE) or userns.exit_code == 0:
                    self._root_setpriv[image] = None
                    self._root_refusals[image] = (
                        "the agent's commands could make a user namespace here (no seccomp filter: gVisor), in which "
                        "a process holds what marks the image's own" if userns.exit_code == 0 else
                        f"the agent's commands were not stripped of their capabilities (bounding sets {agent:x}, {runner:x})")
                    await sandbox.close()
                    return await self.start(spec)
                self._root_proven.add(image)
            if facts.entrypoint:
                await sandbox.start_entrypoint(facts, {**({"HOME": facts.home} if facts.home else {}), **facts.env,
                                                       **spec.env})
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _start(self, image: str, spec: SandboxSpec, facts: ImageFacts, setpriv: str | None,
                     probe_only: bool = False) -> DockerSandbox:
        workdir = spec.cwd or facts.workdir or CONTAINER_WORKDIR
        home = (None, False, None) if probe_only else await self._home(image, facts.home, workdir)
        container_id = await self.run_blocking(self._create, image, workdir, spec, setpriv, probe_only, home)
        sandbox = DockerSandbox(self, container_id, workdir, facts.user, (home[0], home[1], home[2] is not None))
        sandbox.task_env, sandbox.image_env = dict(spec.env), facts.env
        if self.settings.network and self.egress is not None:
            sandbox.network_env = egress_env()
            try:  # before the agent's first command; the init holds the container's network
                pid = int((await self.run_blocking(sandbox._state)).get("Pid") or 0)
                if pid <= 0:
                    raise SandboxError("the container is not running")
                sandbox.egress_stop = await self.egress.serve(await listener_inside(pid), container_id[:12])
            except BaseException:
                await sandbox.close()
                raise
        # the work directory is a volume (the engine makes it) and the scratch one is made when used,
        # so only an image's first sandbox needs the probe: it was one exec more per prompt
        await sandbox.learn_environment(workdir, self._environments, (image, workdir))
        return sandbox

    def _image_facts(self, image: str) -> ImageFacts | None:
        try:
            config = self.client.images.get(image).attrs.get("Config") or {}
        except (ImageNotFound, APIError):
            return None
        workdir = config.get("WorkingDir") or ""
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        user = config.get("User") or "0"
        home = env.get("HOME") or self._passwd_home(image, user)
        return ImageFacts(
            workdir=workdir if workdir.startswith("/") and workdir.rstrip("/") else None,  # "/" is no work directory
            user=user, env=env, entrypoint=tuple(config.get("Entrypoint") or ()),
            home=home if home and home.startswith("/") and home.rstrip("/") else None)

    def _passwd_home(self, image: str, user: str) -> str | None:
        """The home of the image's user in its own /etc/passwd (read from a container never started)."""
        import io
        import tarfile

        name = user.split(":", 1)[0] or "0"
        try:
            helper = self.client.api.create_container(
                image, ["true"], labels={LABEL: "1", f"{LABEL}.run": self.settings.run_label})["Id"]
        except (ImageNotFound, APIError):
            return None
        try:
            stream, _ = self.client.api.get_archive(helper, "/etc/passwd")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                data = tar.extractfile(member) if member is not None else None
                text = data.read().decode(errors="replace") if data is not None else ""
        except (NotFound, APIError, tarfile.TarError):
            return None
        finally:
            self._remove_blocking(helper)
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and name in (fields[0], fields[2]):
                return fields[5]
        return None

    async def _home(self, image: str, home: str | None, workdir: str) -> tuple[str | None, bool, str | None]:
        """The image's home: (where, whether a volume over it lets the agent's commands write it, the
        run's volume holding it as the image has it). Under a tmpfs its image's files are hidden
        from all (nothing to copy); in the work directory it is written already."""
        if home is None:
            return None, False, None
        if under_any(home, TMPFS):
            return home, False, None
        volume = self.settings.read_only_root and not under_any(home, (workdir,))
        pristine: str = await self._image_checks(("home", image, home),
                                                 lambda: self.run_blocking(self._pristine_volume, image, home))
        return home, volume, pristine

    def _pristine_volume(self, image: str, home: str) -> str:
        """A volume of the run's holding the image's `home` as the image has it: Docker fills a new
        volume with the image's files where it is mounted, here in a container never started."""
        name = f"{LABEL}-home-{self.settings.run_key}-{secrets.token_hex(4)}"
        labels = {LABEL: "1", f"{LABEL}.run": self.settings.run_label}
        try:
            self.client.volumes.create(name=name, labels=labels)
            self._volumes.append(name)
            helper = self.client.api.create_container(
                image, ["true"], labels=labels,
                host_config=self.client.api.create_host_config(mounts=[Mount(target=home, source=name, type="volume")]))
            self._remove_blocking(helper["Id"])
        except (ImageNotFound, APIError) as exc:
            raise SandboxError(f"cannot copy the home directory {home} of {image}: "
                               f"{getattr(exc, 'explanation', None) or exc}") from exc
        return name

    def _create(self, image: str, workdir: str, spec: SandboxSpec, setpriv: str | None, probe_only: bool = False,
                home: tuple[str | None, bool, str | None] = (None, False, None)) -> str:
        """The container. With `setpriv` (the image's root keeps its capabilities) it holds
        IMAGE_ROOT_CAPS, its PID 1 is KEEPER, as the keeper user with none, and the image's
        ENTRYPOINT is started apart (`start_entrypoint`); otherwise it holds none, and an init runs the
        ENTRYPOINT with `sleep infinity` as the keeper user (`probe_only`: no ENTRYPOINT)."""
        s = self.settings
        labels = {
            LABEL: "1", f"{LABEL}.run": s.run_label, f"{LABEL}.prompt-id": spec.prompt_id,
            f"{LABEL}.created": datetime.now(UTC).isoformat(timespec="seconds"),
            **spec.labels,
        }
        try:
            container = self.client.containers.create(
                # an init as PID 1 reaps the orphans of background jobs (sleep would leave zombies)
                image, None if setpriv else ["infinity"] if probe_only else ["sleep", "infinity"], detach=True, labels=labels, working_dir=workdir,
                # root for the engine to give the commands run as root their capabilities; PID 1 drops to the keeper
                **({"entrypoint": [setpriv, *KEEPER_SETPRIV, "/bin/sh", "-c", KEEPER], "user": "0", "init": False}
                   if setpriv else {"init": True, "user": KEEPER_USER, "entrypoint": ["sleep"] if probe_only else None}),
                network_mode="none",  # its own; with --network, its way out is placed in it after it starts
                read_only=s.read_only_root,
                mounts=[Mount(target=workdir, source=None, type="volume"),
                        # the image's home, the agent's to write (Docker fills it with the image's files)
                        *([Mount(target=home[0], source=None, type="volume")] if home[0] and home[1] else []),
                        *([Mount(target=PRISTINE_HOME, source=home[2], type="volume", read_only=True)] if home[2] else []),
                        # the browser driver, a public static binary from this machine, read-only
                        *([Mount(target=DRIVER_MOUNT, source=s.driver_dir, type="bind", read_only=True)]
                          if s.driver_dir else []),
                        # the agent harness the run drives (--agent), installed once on this machine
                        *([Mount(target=HARNESS_MOUNT, source=s.harness_dir, type="bind", read_only=True)]
                          if s.harness_dir else [])],
                tmpfs={"/tmp": f"rw,exec,nosuid,size={parse_size(s.disk)}", "/run": "rw,nosuid,size=64m", "/var/tmp": "rw,exec,nosuid,size=256m",
                       "/logs": "rw,nosuid,size=64m", "/tests": "rw,exec,nosuid,size=256m",
                       "/solution": "rw,exec,nosuid,size=256m"},
                cap_drop=["ALL"], cap_add=list(IMAGE_ROOT_CAPS) if setpriv else None, security_opt=["no-new-privileges"],
                pids_limit=s.pids_limit + self.pids_headroom,
                mem_limit=spec.memory or s.memory, memswap_limit=spec.memory or s.memory,
                nano_cpus=int((spec.cpus or s.cpus) * 1e9), runtime=s.runtime, environment={**RUNNER_ENV, **(egress_env() if s.network else {}), **spec.env},
            )
        except ImageNotFound as exc:
            raise ImageUnavailable(f"image {image} is not on this Docker engine: {exc.explanation}") from exc
        except APIError as exc:
            raise SandboxError(f"cannot create a container from {image}: {exc.explanation or exc}") from exc
        try:
            container.start()
        except APIError as exc:
            self._remove_blocking(container.id)
            raise SandboxError(f"cannot start a container from {image}: {exc.explanation or exc}") from exc
        return str(container.id)

    async def remove(self, container_id: str) -> None:
        await self.run_blocking(self._remove_blocking, container_id)

    def _remove_blocking(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:
            if "already in progress" not in str(exc):
                raise

    async def sweep_orphans(self) -> int:
        def sweep() -> int:
            found = self.client.api.containers(all=True, filters={"label": f"{LABEL}.run={self.settings.run_label}"})
            for c in found:
                self._remove_blocking(c["Id"])
            volumes = self.client.api.volumes(filters={"label": f"{LABEL}.run={self.settings.run_label}"})
            self._remove_volumes([v["Name"] for v in (volumes or {}).get("Volumes") or []])
            return len(found)

        return await self.run_blocking(sweep)

    async def finish_run(self) -> None:
        made, self._volumes = self._volumes, []
        await self.run_blocking(self._remove_volumes, made)

    def _remove_volumes(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(NotFound, APIError):  # one still in use goes with the run's last sweep
                self.client.api.remove_volume(name)

    async def shutdown(self) -> None:
        if self.client is not None:
            await self.run_blocking(self.client.close)
        self._pool.shutdown(wait=False, cancel_futures=True)
