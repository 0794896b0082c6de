"""Flame backend: the Flame article's persistent `sandbox` and parallel `session`, on flamepy 0.6.0.

- Each prompt's sandbox is a Flame session of the flmexec application with one executor
  (`min_instances = max_instances = 1`), so its calls run one after another where its files
  are: every tool (terminal, file, `sandbox`) runs there. Its work directory lives under /tmp,
  removed at its end (kept with `--keep_flame_sessions`, and under `--flame_id_scheme=machine`).
- The `session` tool submits all snippets at once to one reusable, parallel Flame session per
  run, then collects results in input order; each snippet runs in a fresh temporary directory.
- flmexec reports stdout only, so each task runs `flame_runner` (exit code, stderr, timeout).
- Session ids are stable: `<prefix>-sbx-<run>-<prompt>` and `<prefix>-ssn-<run>` per run (the
  default), or the article's machine-wide `<prefix>-sandbox-<mac>` / `<prefix>-session-<mac>`.
  An open session is reopened; a closed one keeps its id on the cluster, so the next generation
  `<id>-1`, `<id>-2`, ... is used.
- The connection comes from flamepy's own configuration (`~/.flame/flame.yaml`, `FLAME_ENDPOINT`,
  `FLAME_CA_FILE`) but is built here, with proxies off and a short connect timeout, instead of
  through flamepy's process-wide singleton. Every wait is bounded; blocking calls run in threads.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from .base import BackendSettings, BaseBackend, ExecResult, Language, SandboxError, SandboxSpec, ShellSandbox, flag
from .flame_runner import flmexec_request, parse_result, runner_source

SDK_MISSING: str | None = None  # the `flame` extra; without it this module (and its flags) still loads
try:
    import grpc
    from flamepy import FlameContext, FlameError, SessionAttributes
    from flamepy.core.client import Connection
    from flamepy.proto.frontend_pb2 import (
        CreateTaskRequest,
        GetTaskRequest,
        ListSessionRequest,
        WatchTaskRequest,
    )
    from flamepy.proto.frontend_pb2_grpc import FrontendStub
    from flamepy.proto.types_pb2 import TaskSpec
except ImportError as exc:
    SDK_MISSING = exc.name

DONE_STATES = {2: "succeed", 3: "failed", 4: "cancelled"}  # flame.v1.TaskState; flamepy 0.6.0 lacks 4
MAX_GENERATIONS = 50
TAG = b'{"tool":"hermes-batch","v":1}'


class StaleSession(RuntimeError):
    """A submission failed: the session is closed, gone, or the cluster blinked. Re-acquire and retry once."""


class FlameLink:
    """Everything this backend asks of the Flame frontend, in one place (blocking calls)."""

    def __init__(self, settings: FlameSettings):
        self.settings = settings
        self.conn: Any = None  # flamepy's Connection and the frontend's gRPC stub, once connected
        self.stub: Any = None

    def connect(self) -> str:
        ctx = FlameContext()  # ~/.flame/flame.yaml, then FLAME_ENDPOINT / FLAME_CA_FILE
        endpoint = ctx.endpoint
        if "://" not in endpoint:
            raise SandboxError(f"Flame endpoint {endpoint!r} has no scheme; write it as http://host:port or https://host:port")
        from urllib.parse import urlparse

        parsed = urlparse(endpoint)
        target = f"{parsed.hostname}:{parsed.port or 8080}"
        options = [("grpc.enable_http_proxy", 0),  # the SDK's connections never go through a proxy
                   ("grpc.max_receive_message_length", 16 * 2**20)]
        if parsed.scheme == "https":
            ca = ctx.tls.ca_file if ctx.tls else None
            creds = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes() if ca else None)
            channel = grpc.secure_channel(target, creds, options=options)
        else:
            channel = grpc.insecure_channel(target, options=options)
        try:
            grpc.channel_ready_future(channel).result(timeout=self.settings.flame_connect_timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            raise SandboxError(
                f"cannot reach the Flame cluster at {endpoint} within {self.settings.flame_connect_timeout:g} s "
                "(set FLAME_ENDPOINT or ~/.flame/flame.yaml)"
            ) from None
        self.stub = FrontendStub(channel)
        self.conn = Connection(endpoint, channel, self.stub)
        app = self.conn.get_application(self.settings.flame_application)
        if app is None:
            raise SandboxError(f"application {self.settings.flame_application!r} is not registered on the Flame cluster at {endpoint}")
        return endpoint

    def acquire(self, base_id: str, *, parallel: bool) -> str:
        """Open the session `base_id` (or its first open generation), creating it if absent."""
        max_instances = None if parallel else 1
        for gen in range(MAX_GENERATIONS):
            sid = base_id if gen == 0 else f"{base_id}-{gen}"
            attrs = SessionAttributes(application=self.settings.flame_application, id=sid, common_data=TAG,
                                      min_instances=0 if parallel else 1, max_instances=max_instances)
            try:
                session = self.conn.open_session(sid, attrs)
            except FlameError as exc:
                text = str(exc)
                if "not open" in text or "spec mismatch" in text or "closed" in text.lower():
                    continue  # a closed session keeps its id: use the next generation
                raise SandboxError(f"cannot open Flame session {sid}: {text}") from exc
            if int(session.state) == 0:
                return sid
        raise SandboxError(f"no usable generation of Flame session {base_id} among {MAX_GENERATIONS}")

    def submit(self, session_id: str, payload: bytes) -> str:
        try:
            task = self.stub.CreateTask(CreateTaskRequest(task=TaskSpec(session_id=session_id, input=payload)), timeout=60)
        except grpc.RpcError as exc:
            raise StaleSession(f"cannot submit to {session_id}: {exc.details()}") from exc
        return task.metadata.id

    def wait(self, session_id: str, task_id: str, deadline: float) -> tuple[str, bytes | None, str]:
        """(state, output, message) once the task ends, or ("timeout", None, ...) at the deadline."""
        request = WatchTaskRequest(task_id=task_id, session_id=session_id)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None, "no result from the Flame task in time"
            try:
                for task in self.stub.WatchTask(request, timeout=left):
                    if task.status.state in DONE_STATES:
                        return _ended(task)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return "timeout", None, "no result from the Flame task in time"
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    return "error", None, f"watching the task failed: {exc.details()}"
            # the stream ended without an end state: ask directly, then watch again
            try:
                task = self.stub.GetTask(GetTaskRequest(task_id=task_id, session_id=session_id), timeout=min(10, max(0.1, left)))
                if task.status.state in DONE_STATES:
                    return _ended(task)
            except grpc.RpcError:
                pass
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def close(self, session_id: str) -> None:
        for _ in range(10):
            try:
                self.conn.close_session(session_id)
                return
            except FlameError as exc:
                if "running" not in str(exc).lower():
                    return  # gone or already closed
                time.sleep(0.5)  # the server refuses while tasks run

    def open_sessions(self, prefix: str) -> list[str]:
        sessions = self.stub.ListSession(ListSessionRequest(), timeout=30).sessions
        return [s.metadata.id for s in sessions if s.metadata.id.startswith(prefix) and s.status.state == 0]

    def disconnect(self) -> None:
        if self.conn is not None:
            self.conn._channel.close()


def _ended(task) -> tuple[str, bytes | None, str]:
    state = DONE_STATES[task.status.state]
    message = next((e.message for e in reversed(task.status.events) if e.message), "")
    output = task.spec.output if task.spec.HasField("output") else None
    return state, output, message


def machine_id() -> str:
    """The article's machine identity: the MAC of the first physical network interface."""
    for nic in sorted(Path("/sys/class/net").glob("*")):
        if (nic / "device").exists():
            mac = (nic / "address").read_text().strip().replace(":", "")
            if mac and mac != "000000000000":
                return mac
    raise SandboxError("flame_id_scheme=machine needs a physical network interface, and this host has none")


class FlameSandbox(ShellSandbox):
    keeps_processes = False  # each task's runner ends what its code started before it reports
    def __init__(self, backend: FlameBackend, session_id: str, base_id: str, root: str, own_session: bool):
        self.backend = backend
        self.session_id = session_id
        self.base_id = base_id
        self.root = root
        self.workdir = f"{root}/work"
        self.scratch = f"{root}/tmp"
        self.check_parent = self.scratch  # a Flame host's /tmp is shared by its sessions
        self.own_session = own_session
        self.output_limit = backend.settings.output_limit

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        self.check_open()
        source = runner_source(
            code, language=language, timeout=timeout, cwd=cwd or self.workdir, scratch=self.scratch,
            env={"HOME": self.scratch, "TMPDIR": self.scratch, **self.task_env, **(env or {})},
            mkdirs=[self.workdir, self.scratch], limit=output_limit or self.output_limit, runner=runner,
        )
        result, self.session_id = await self.backend.run_task(self.base_id, self.session_id, source, timeout, parallel=False)
        if result["exit_code"] == -1 and not result.get("duration"):
            raise SandboxError(f"the Flame sandbox {self.session_id} failed to run the command: {result['stderr']}")
        return _exec_result(result)

    async def run_snippets(self, codes, *, language, timeout) -> list[ExecResult]:
        return await self.backend.run_session(codes, language, timeout)

    async def end_processes(self) -> None:
        """Nothing to do: each task's runner ends what its code started before it reports."""

    async def close(self) -> None:
        if not self.mark_closed():
            return
        # the executor's /tmp outlives the session; a machine-wide session's prompt directories are
        # left (two runs of one dataset share them there)
        if self.own_session and not self.backend.settings.keep_flame_sessions:
            source = runner_source(f"rm -rf {shlex.quote(self.root)}", language="shell", timeout=10, cwd="/",
                                   scratch=None, runner=True)
            try:
                await self.backend.run_task(self.base_id, self.session_id, source, 10, parallel=False)
            except SandboxError:
                pass  # a lost session's files are beyond reach; closing goes on
        if self.own_session and not self.backend.keep_sessions:
            await self.backend.blocking(self.backend.link.close, self.session_id)


def _exec_result(r: dict[str, Any]) -> ExecResult:
    return ExecResult(exit_code=int(r["exit_code"]), stdout=r.get("stdout", ""), stderr=r.get("stderr", ""),
                      duration=float(r.get("duration") or 0.0), timed_out=bool(r.get("timed_out")))


class FlameSettings(BackendSettings):
    keep_flame_sessions: bool = flag(False, "leave Flame sessions open at the end of a run")
    flame_id_scheme: Literal["run", "machine"] = flag("run", "session ids per run, or per machine (the article's)")
    flame_application: str = "flmexec"
    flame_session_prefix: str = "hermes"
    flame_connect_timeout: float = 5.0
    flame_threads: int = 128  # blocking flamepy calls in flight per worker (a wait holds one)
    flame_wait_grace: float = 30.0  # seconds beyond a task's own timeout before the wait gives up


class FlameBackend(BaseBackend):
    name = "flame"
    Settings = FlameSettings
    settings: FlameSettings

    def __init__(self, settings: FlameSettings):
        super().__init__(settings)
        self.link = FlameLink(settings)
        self._pool = ThreadPoolExecutor(max_workers=settings.flame_threads, thread_name_prefix="flame")
        self.run_key = settings.run_key
        prefix = settings.flame_session_prefix
        if settings.flame_id_scheme == "machine":
            mac = machine_id()
            self.sandbox_base, self.session_base = f"{prefix}-sandbox-{mac}", f"{prefix}-session-{mac}"
        else:
            self.sandbox_base, self.session_base = f"{prefix}-sbx-{self.run_key}", f"{prefix}-ssn-{self.run_key}"
        # machine-wide sessions are shared with other conversations: never closed by a run (as in the article)
        self.keep_sessions = settings.keep_flame_sessions or settings.flame_id_scheme == "machine"
        self._session_id: str | None = None
        self._session_lock = asyncio.Lock()

    async def blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def setup(self) -> None:
        try:
            await self.blocking(self.link.connect)
        except FlameError as exc:
            raise SandboxError(f"Flame configuration problem: {exc}") from exc
        # flmexec runs tasks on the executor's host, unjailed: whatever its network is, the prompts share it
        self.notes.append("warning: flame: a prompt's code runs on the executor's host in that host's network, "
                          f"{'with' if self.settings.network else 'even without'} --network: prompts on one executor share "
                          "its loopback and ports, and the runner places no network guard there (docs/security.md)")

    async def start(self, spec: SandboxSpec) -> FlameSandbox:
        if self.settings.flame_id_scheme == "machine":
            base, own = self.sandbox_base, False
        else:
            base, own = f"{self.sandbox_base}-{_safe(spec.prompt_id)}", True
        sid = await self.blocking(lambda: self.link.acquire(base, parallel=False))
        root = f"/tmp/hermes-batch/{sid}" + ("" if own else f"/{_safe(spec.prompt_id)}")
        sandbox = FlameSandbox(self, sid, base, root, own)
        sandbox.task_env = dict(spec.env)
        await sandbox.learn_environment(sandbox.workdir)
        return sandbox

    async def run_task(self, base_id: str, session_id: str, source: str, timeout: float, *, parallel: bool):
        """Submit one runner task and wait for it; a stale session is re-acquired and the submission retried once."""
        payload = flmexec_request(source)

        def go() -> tuple[dict[str, Any], str]:
            sid = session_id
            try:
                task_id = self.link.submit(sid, payload)
            except StaleSession:
                sid = self.link.acquire(base_id, parallel=parallel)
                task_id = self.link.submit(sid, payload)
            state, output, message = self.link.wait(sid, task_id, time.monotonic() + timeout + self.settings.flame_wait_grace)
            if state != "succeed":
                return {"exit_code": -1, "stdout": "", "stderr": f"Flame task {state}: {message}"}, sid
            return parse_result(output), sid

        try:
            return await self.blocking(go)
        except (FlameError, StaleSession) as exc:
            raise SandboxError(f"Flame refused the task: {exc}") from exc

    async def run_session(self, codes: list[str], language: str, timeout: float) -> list[ExecResult]:
        """The `session` tool: submit every snippet before collecting any, results in input order."""
        async with self._session_lock:
            if self._session_id is None:
                self._session_id = await self.blocking(lambda: self.link.acquire(self.session_base, parallel=True))
        payloads = [flmexec_request(runner_source(c, language=language, timeout=timeout, cwd=None, scratch=None))
                    for c in codes]

        def submit() -> tuple[str, list[str]]:
            sid = self._session_id
            assert sid is not None  # acquired above
            try:
                return sid, [self.link.submit(sid, p) for p in payloads]
            except StaleSession:
                # re-acquire and resubmit the whole batch once (earlier snippets may run twice, as the article warns)
                sid = self.link.acquire(self.session_base, parallel=True)
                self._session_id = sid
                return sid, [self.link.submit(sid, p) for p in payloads]

        try:
            sid, task_ids = await self.blocking(submit)
            # snippets may queue behind each other on a busy cluster. Each wait is its own pool job,
            # awaited from the event loop: a pool thread never blocks on another pool job, so many
            # concurrent calls cannot starve the pool into a deadlock (each wait ends by its deadline)
            deadline = time.monotonic() + timeout * len(codes) + self.settings.flame_wait_grace
            waits = await asyncio.gather(*(self.blocking(self.link.wait, sid, t, deadline) for t in task_ids))
        except (FlameError, StaleSession) as exc:
            raise SandboxError(f"Flame refused the session's tasks: {exc}") from exc
        return [_exec_result(parse_result(output) if state == "succeed"
                             else {"exit_code": -1, "stdout": "", "stderr": f"Flame task {state}: {message}"})
                for state, output, message in waits]

    async def sweep_orphans(self) -> int:
        """Close this run's sandbox sessions that a crashed earlier run left open (unless sessions are kept)."""
        if self.keep_sessions:
            return 0
        leftovers = await self.blocking(self.link.open_sessions, f"{self.sandbox_base}-")
        for sid in leftovers:
            await self.blocking(self.link.close, sid)
        return len(leftovers)

    async def finish_run(self) -> None:
        """At the end of a run: release its shared session (unless sessions are kept)."""
        if self.keep_sessions:
            return
        for sid in await self.blocking(self.link.open_sessions, self.session_base):
            await self.blocking(self.link.close, sid)

    async def shutdown(self) -> None:
        await self.blocking(self.link.disconnect)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in text.lower())

