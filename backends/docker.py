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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from .base import (
    CONTAINER_WORKDIR,
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
    SandboxEnvironment,
    SandboxError,
    SandboxExhausted,
    SandboxSpec,
    ShellSandbox,
    decode,
    killed_by_timeout,
    parse_size,
)

SDK_MISSING: str | None = None  # the `docker` extra; without it this module (and its flags) still loads
try:
    import docker
    from docker.errors import APIError, BuildError, DockerException, ImageNotFound, NotFound
    from docker.types import Mount
except ImportError as exc:
    SDK_MISSING = exc.name

LABEL = "hermes-batch"
KEEPER_USER = "2000000000:2000000000"  # no image's user: the container's init and keeper run as it
SCRATCH = "/tmp/.hermes-batch"


class DockerSandbox(ShellSandbox):
    own_pid_namespace = True
    own_root = True
    # the init and its `sleep infinity` run as KEEPER_USER: the prompt's commands can neither signal
    # them nor write their memory (a review turned the spared keeper into a loop that forged results)
    others_are_keepers = True
    # its mounts (the work directory is one too); the root is read-only
    agent_writable: tuple[str, ...] | None = ("/tmp", "/run", "/var/tmp", "/logs", "/tests", "/solution", "/dev/shm")

    async def end_processes(self) -> None:
        try:
            await super().end_processes()
        finally:
            state = await self.backend.run_blocking(self._state)
            if state.get("OOMKilled"):
                raise SandboxExhausted(f"the container used up its --memory={self.backend.settings.memory} (files in "
                                       "/tmp and /dev/shm count against it) and was ended")
            if not state.get("Running"):  # seen under gVisor (runsc): the engine ends the container
                raise SandboxError(f"the container ended (exit code {state.get('ExitCode')}) while the prompt's "
                                   "processes were ended")

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

    def __init__(self, backend: DockerBackend, container_id: str, workdir: str, user: str = "0"):
        self.backend = backend
        self.user = user  # the image's own user: what the prompt's commands run as
        self.api = backend.client.api
        self.id = container_id
        self.workdir = workdir
        self.scratch = SCRATCH
        if not backend.settings.read_only_root:
            self.agent_writable = None  # the whole root is the agent's to change
        self.output_limit = backend.settings.output_limit
        self.session_parallelism = backend.settings.session_parallelism

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        self.check_open()
        argv = await self._timed_argv(code, language, timeout)
        return await self.backend.run_blocking(
            self._exec_blocking, argv, cwd or self.workdir, self.command_env(env, runner),
            output_limit or self.output_limit, timeout,
        )

    def _exec_blocking(self, argv, cwd, env, limit, timeout) -> ExecResult:
        started = time.monotonic()
        try:
            exec_id = self.api.exec_create(self.id, argv, workdir=cwd, environment=env, stdout=True, stderr=True,
                                           user=self.user)["Id"]
            stream = self.api.exec_start(exec_id, stream=True, demux=True)
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
                if now - exited_at >= 1.0:
                    break
        if not done.is_set():
            done.set()
            stream.close()

    async def close(self) -> None:
        if not self.mark_closed():
            return
        await self.backend.remove(self.id)


class DockerBackend(BaseBackend):
    name = "docker"
    uses_images = True
    builds_images = True

    def __init__(self, settings: BackendSettings):
        super().__init__(settings)
        self.client: Any = None  # docker.DockerClient, once setup() connected
        self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="docker")
        self._image_checks = OncePerKey()
        self._users: dict[str, str] = {}  # image → the user its commands run as
        self._workdirs: dict[str, str | None] = {}  # image → its own WORKDIR, where it has one
        self._image_envs: dict[str, dict[str, str]] = {}  # image → its own ENV
        self._environments: dict[Any, SandboxEnvironment] = {}  # (image, workdir) → what its probe said

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
        if image not in self._workdirs:  # the image's own WORKDIR, as its configuration says (not its Dockerfile's text)
            self._workdirs[image] = await self.run_blocking(self._image_workdir, image)
        workdir = spec.cwd or self._workdirs[image] or CONTAINER_WORKDIR
        container_id, user = await self.run_blocking(self._create, image, workdir, spec)
        sandbox = DockerSandbox(self, container_id, workdir, user)
        sandbox.task_env, sandbox.image_env = dict(spec.env), self._image_envs.get(image, {})
        # the work directory is a volume (the engine makes it) and the scratch one is made when used,
        # so only an image's first sandbox needs the probe: it was one exec more per prompt
        await sandbox.learn_environment(workdir, self._environments, (image, workdir))
        return sandbox

    def _image_workdir(self, image: str) -> str | None:
        try:
            found = (self.client.images.get(image).attrs.get("Config") or {}).get("WorkingDir") or ""
        except (ImageNotFound, APIError):
            return None  # the create that follows says what is wrong with the image
        return found if found.startswith("/") and found.rstrip("/") else None  # "/" is no work directory

    def _create(self, image: str, workdir: str, spec: SandboxSpec) -> tuple[str, str]:
        """The container, and the user its commands run as (the image's)."""
        s = self.settings
        labels = {
            LABEL: "1", f"{LABEL}.run": s.run_label, f"{LABEL}.prompt-id": spec.prompt_id,
            f"{LABEL}.created": datetime.now(UTC).isoformat(timespec="seconds"),
            **spec.labels,
        }
        try:
            container = self.client.containers.create(
                # an init as PID 1 reaps the orphans of background jobs (sleep would leave zombies)
                image, ["sleep", "infinity"], detach=True, init=True, labels=labels, working_dir=workdir,
                user=KEEPER_USER,
                network_mode="bridge" if s.network else "none",
                read_only=s.read_only_root,
                mounts=[Mount(target=workdir, source=None, type="volume")],
                tmpfs={"/tmp": f"rw,exec,nosuid,size={parse_size(s.disk)}", "/run": "rw,nosuid,size=64m", "/var/tmp": "rw,exec,nosuid,size=256m",
                       "/logs": "rw,nosuid,size=64m", "/tests": "rw,exec,nosuid,size=256m",
                       "/solution": "rw,exec,nosuid,size=256m"},
                cap_drop=["ALL"], security_opt=["no-new-privileges"],
                pids_limit=s.pids_limit, mem_limit=spec.memory or s.memory, memswap_limit=spec.memory or s.memory,
                nano_cpus=int((spec.cpus or s.cpus) * 1e9), runtime=s.runtime, environment={**RUNNER_ENV, **spec.env},
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
        if image not in self._users:  # one inspection per image
            config = container.image.attrs.get("Config") or {}
            self._users[image] = config.get("User") or "0"
            self._image_envs[image] = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        return container.id, self._users[image]

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
            return len(found)

        return await self.run_blocking(sweep)

    async def shutdown(self) -> None:
        if self.client is not None:
            await self.run_blocking(self.client.close)
        self._pool.shutdown(wait=False, cancel_futures=True)
