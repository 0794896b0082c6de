"""Modal backend: one Modal Sandbox per prompt, commands run with `Sandbox.exec`.

Uses Modal's async API (`.aio`) throughout, so no call blocks the event loop. Sandboxes belong to
the Modal app `hermes-batch` (created if missing) and carry the run's tags, so `sweep_orphans`
can terminate what a crashed run left; each also has a server-side lifetime (`timeout`), the
one leak protection that survives `kill -9`. Credentials are Modal's own (`modal token new`, or
MODAL_TOKEN_ID / MODAL_TOKEN_SECRET); nothing of the runner's environment reaches a sandbox.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Literal

from ..util import parse_size
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
    SandboxError,
    SandboxSpec,
    ShellSandbox,
    decode,
    killed_by_timeout,
)
from .egress import public_ipv4

SDK_MISSING: str | None = None  # the `modal` extra; without it this module (and its flags) still loads
try:
    import modal
except ImportError as exc:
    SDK_MISSING = exc.name

APP_NAME = "hermes-batch"
SANDBOX_LIFETIME = 3600  # seconds; Modal ends a sandbox after this even if the runner is gone
MODAL_RUNTIMES: dict[str, Literal["gvisor", "vm"]] = {"gvisor": "gvisor", "vm": "vm"}  # --runtime values Modal knows


def memory_mib(text: str) -> int:
    try:
        return max(1, parse_size(text, "memory size") // 2**20)
    except ValueError as exc:
        raise SandboxError(str(exc)) from None


class ModalSandbox(ShellSandbox):
    own_pid_namespace = True  # the sandbox's entrypoint (`sleep infinity`) is PID 1
    own_root = True
    agent_writable = None  # its root is writable to the commands (Modal offers no read-only one)
    def __init__(self, sandbox, workdir: str, settings: BackendSettings):
        self.sb = sandbox
        self.workdir = workdir
        self.scratch = "/tmp/.hermes-batch"
        self.output_limit = settings.output_limit
        self.session_parallelism = settings.session_parallelism

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        self.check_open()
        argv = await self._timed_argv(code, language, timeout)  # Modal's own exec timeout backs it up
        started = time.monotonic()
        try:
            proc = await self.sb.exec.aio(*argv, timeout=int(timeout) + KILL_GRACE + 3, workdir=cwd or self.workdir,
                                          env=self.command_env(env, runner), text=False)
            limit = output_limit or self.output_limit
            out, err = BoundedBuffer(limit), BoundedBuffer(limit)
            await asyncio.gather(_pump(proc.stdout, out), _pump(proc.stderr, err))
            exit_code = await proc.wait.aio()
        except modal.exception.Error as exc:
            raise SandboxError(f"Modal sandbox failed: {type(exc).__name__}: {exc}") from exc
        elapsed = time.monotonic() - started
        timed_out = exit_code == -1 or killed_by_timeout(exit_code, elapsed, timeout)  # Modal reports its timeout as -1
        return ExecResult(TIMEOUT_EXIT_CODE if timed_out else exit_code, decode(out.getvalue()), decode(err.getvalue()),
                          elapsed, timed_out)

    async def close(self) -> None:
        if not self.mark_closed():
            return
        try:
            await self.sb.terminate.aio()
        except modal.exception.Error:
            pass  # already gone; the run's sweep and the sandbox's lifetime cover the rest


async def _pump(stream, sink: BoundedBuffer) -> None:
    async for chunk in stream:
        sink.feed(chunk if isinstance(chunk, bytes) else chunk.encode())


class ModalBackend(BaseBackend):
    name = "modal"
    uses_images = True

    def __init__(self, settings: BackendSettings):
        super().__init__(settings)
        self.app: Any = None  # the Modal app, once setup() looked it up
        self._images: dict[str, object] = {}
        self._builds = OncePerKey()

    async def setup(self) -> None:
        try:
            self.app = await modal.App.lookup.aio(APP_NAME, create_if_missing=True)
        except modal.exception.AuthError as exc:
            raise SandboxError(f"Modal rejected the credentials ({exc}); run `modal token new` or set "
                               "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET") from exc
        except modal.exception.Error as exc:
            raise SandboxError(f"cannot reach Modal: {type(exc).__name__}: {exc}") from exc

    def _image(self, ref: str):
        if ref not in self._images:
            self._images[ref] = modal.Image.from_registry(ref)  # lazy: nothing is built here
        return self._images[ref]

    async def prepare_image(self, image: str | None) -> str:
        """Build each distinct image once before any model call, so a bad image fails its prompts early."""
        ref = image or self.settings.image
        await self._builds(ref, lambda: self._build(ref))
        return ref

    async def _build(self, ref: str) -> None:
        try:
            await self._image(ref).build.aio(self.app)
        except modal.exception.Error as exc:
            raise ImageUnavailable(f"Modal could not build image {ref}: {type(exc).__name__}: {exc}") from exc

    async def start(self, spec: SandboxSpec) -> ModalSandbox:
        s = self.settings
        ref = spec.image or s.image
        workdir = spec.cwd or CONTAINER_WORKDIR
        tags = {
            "hermes-batch": "1", "hermes-batch.run": s.run_label, "hermes-batch.prompt-id": spec.prompt_id,
            "hermes-batch.created": datetime.now(UTC).isoformat(timespec="seconds"), **spec.labels,
        }
        try:
            sb = await modal.Sandbox.create.aio(
                "sleep", "infinity", app=self.app, image=self._image(ref), tags=tags, env={**RUNNER_ENV, **spec.env},
                timeout=SANDBOX_LIFETIME, workdir=workdir, cpu=spec.cpus or s.cpus, memory=memory_mib(spec.memory or s.memory),
                block_network=not s.network, runtime=MODAL_RUNTIMES.get(s.runtime or ""),
                # --network: Modal's own network, to public addresses only (no private or metadata one)
                outbound_cidr_allowlist=list(public_ipv4()) if s.network else None,
            )
        except modal.exception.Error as exc:
            raise SandboxError(f"Modal could not create a sandbox from {ref}: {type(exc).__name__}: {exc}") from exc
        sandbox = ModalSandbox(sb, workdir, s)
        sandbox.task_env = dict(spec.env)
        await sandbox.learn_environment(workdir)
        return sandbox

    async def sweep_orphans(self) -> int:
        count = 0
        async for sb in modal.Sandbox.list.aio(app_id=self.app.app_id, tags={"hermes-batch.run": self.settings.run_label}):
            try:
                await sb.terminate.aio()
                count += 1
            except modal.exception.Error:
                pass
        return count
