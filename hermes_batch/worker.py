"""Agent loops on one asyncio event loop, in a process of the pool or a Ray actor.

A `Worker` runs each `WorkItem` it is given and tells `emit` how it settled (wire.py), once per
item whatever happens: the run waits for exactly that. `worker_main` is the pool process around it.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from .agent import AGENT_SYSTEM_PROMPT, AgentRun, has_reasoning, run_agent
from .backends import Backend, SandboxError, SandboxSpec, backend_class, uses_images
from .config import RunConfig, open_backend
from .limits import AdaptiveLimit
from .llm import FatalRunError, PromptFailed, open_client
from .records import Outcome, discarded, failure, kept
from .tools import Tool, ToolContext, tools_for
from .trajectory import build_record, usage_totals
from .wire import (
    Exited,
    Fatal,
    Finished,
    FromWorker,
    Note,
    RateLimited,
    Run,
    Stop,
    Throttle,
    WorkItem,
)

PARENT_CHECK_SECONDS = 0.5


class LazySandbox:
    """Starts the prompt's sandbox in the background (overlapping the first model call), under
    the worker's sandbox limit, and always closes it."""

    def __init__(self, backend: Backend, spec: SandboxSpec, gate: asyncio.Semaphore):
        self.backend, self.spec, self.gate = backend, spec, gate
        self.sandbox = None
        self.start_seconds: float | None = None
        self._task: asyncio.Task | None = None
        self._holding = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._start())

    async def _start(self):
        await self.gate.acquire()
        self._holding = True
        t0 = time.monotonic()
        self.sandbox = await self.backend.start(self.spec)
        self.start_seconds = time.monotonic() - t0
        return self.sandbox

    async def get(self):
        self.start()
        try:
            return await asyncio.shield(self._task)
        except SandboxError:
            raise
        except Exception as exc:  # any start failure is the sandbox's, not the model's
            raise SandboxError(f"could not start a sandbox: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        try:
            if self._task is not None:
                if not self._task.done():
                    self._task.cancel()
                try:
                    await self._task
                except BaseException:
                    pass
            if self.sandbox is not None:
                await self.sandbox.close()
        finally:
            if self._holding:
                self.gate.release()
                self._holding = False


class Worker:
    def __init__(self, number: int, config: RunConfig, api_key: str | None, context: dict[str, Any],
                 loops: int, sandboxes: int, emit: Callable[[FromWorker], None]):
        self.number = number
        self.config = config
        self.context = context  # run facts stamped on every record (fingerprint, backend, ...)
        self.emit = emit
        self.system_prompt = AGENT_SYSTEM_PROMPT + (
            f"\n\n{config.ephemeral_system_prompt}" if config.ephemeral_system_prompt else ""
        )
        self.prefill = [m.model_dump() for m in config.prefill_messages or []]
        self.records_image = uses_images(config.backend)
        self.backend: Backend = open_backend(config)
        self.loops = asyncio.Semaphore(loops)
        self.sandboxes = asyncio.Semaphore(sandboxes)
        self.limit = AdaptiveLimit(loops, on_cut=lambda: emit(RateLimited(number)))
        self.llm = open_client(config.model_settings(), api_key, self.limit)
        self.http: Any = None  # the web provider's client and its guarded twin for model-chosen URLs
        self.fetch_http: Any = None
        self.web: Any = None  # the web provider, when the run has one

    async def open(self) -> None:
        await self.backend.setup()
        provider = self.config.web_provider_name
        if provider:
            import httpx

            from .tools import providers
            from .tools.netguard import guarded_client

            self.http = httpx.AsyncClient(timeout=30, headers={"user-agent": "hermes-batch"})
            self.fetch_http = guarded_client(timeout=30, headers={"user-agent": "hermes-batch"})
            self.web = providers.make(provider, self.config.web_base_url, self.http,
                                      on_note=lambda text: self.emit(Note(self.number, text)))

    async def close(self) -> None:
        await self.llm.close()
        for client in (self.http, self.fetch_http):
            if client is not None:
                await client.aclose()
        await self.backend.shutdown()

    def throttle(self) -> None:
        self.limit.rate_limited(shared=True)

    async def run_one(self, item: WorkItem) -> Finished | Fatal:
        """Run one prompt to its end; what to tell the run (never raises but for cancellation)."""
        async with self.loops:
            started = time.monotonic()
            tools = tools_for(item.toolsets)
            spec = SandboxSpec(prompt_id=item.id, image=item.image, cwd=item.cwd,
                               labels={"hermes-batch.prompt-id": item.id})
            sandbox = LazySandbox(self.backend, spec, self.sandboxes)
            if not self.backend.starts_cheaply:
                sandbox.start()  # alongside the first model call
            ctx = ToolContext(get_sandbox=sandbox.get, command_timeout=self.config.command_timeout,
                              web=self.web, fetch_http=self.fetch_http)
            run = AgentRun()
            try:
                await asyncio.wait_for(run_agent(
                    item.prompt, tools, self.llm, ctx, max_turns=self.config.max_turns,
                    system_prompt=self.system_prompt, prefill=self.prefill,
                    first_tool_choice=self.config.first_tool_choice, run=run,
                ), self.config.prompt_timeout)
            except TimeoutError:
                run.stop_reason = "prompt_timeout"
                run.drop_unanswered_turn()
                if not run.assistant_turns():  # nothing usable was done in time
                    return self._failed(item, "prompt_timeout",
                                        f"no reply within --prompt_timeout={self.config.prompt_timeout:g} s",
                                        usage_totals(run.calls))
            except FatalRunError as exc:
                return Fatal(self.number, str(exc))
            except PromptFailed as exc:
                return self._failed(item, exc.kind, str(exc), usage_totals(exc.calls))
            except SandboxError as exc:
                return self._failed(item, "sandbox_error", str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return self._failed(item, "internal_error", "".join(traceback.format_exception(exc))[-4000:])
            finally:
                await sandbox.close()
            try:
                outcome = self._outcome(item, run, tools, sandbox, started)
            except Exception as exc:  # the run must hear of every prompt, or it waits for it forever
                return self._failed(item, "internal_error", "".join(traceback.format_exception(exc))[-4000:])
            return Finished(self.number, outcome)

    def _outcome(self, item: WorkItem, run: AgentRun, tools: list[Tool], sandbox: LazySandbox, started: float) -> Outcome:
        """A finished agent loop as a kept or discarded record."""
        record = build_record(
            prompt_id=item.id, prompt_index=item.index, batch_num=item.batch_num, run=run, tools=tools,
            toolsets=item.toolsets, model=self.config.model_label, extra=item.extra,
            context={
                **self.context,
                "image": (item.image or self.config.sandbox.image) if self.records_image else None,
                "attempt": item.attempt,
                "timings": {
                    "total_seconds": round(time.monotonic() - started, 3),
                    "sandbox_start_seconds": round(sandbox.start_seconds, 3) if sandbox.start_seconds else None,
                },
            },
        )
        if self.config.require_reasoning and not any(has_reasoning(m) for m in run.assistant_turns()):
            return discarded(record, "no_reasoning")
        return kept(record)

    def _failed(self, item: WorkItem, kind: str, message: str, usage: dict[str, Any] | None = None) -> Finished:
        return Finished(self.number, failure(item.id, item.index, item.attempt, kind, message, usage))


class RunnerWatch:
    """Whether the run's process is gone. A worker's parent is the fork server, which lives as long
    as any worker does, so the worker watches the run itself, through a pidfd."""

    def __init__(self, runner: int):
        self.parent = os.getppid()
        self.fd: int | None = None
        self.dead = False
        try:
            self.fd = os.pidfd_open(runner)
        except ProcessLookupError:
            self.dead = True  # gone before we looked
        except (OSError, AttributeError):
            pass  # no pidfds here (Linux < 5.3): the parent is the run (spawned workers)

    def gone(self) -> bool:
        if not self.dead:
            self.dead = bool(select.select([self.fd], [], [], 0)[0]) if self.fd is not None else os.getppid() != self.parent
        return self.dead


async def serve(worker: Worker, tasks: Any, runner: RunnerWatch) -> None:
    """The pool process's loop: run what the `tasks` queue hands over until Stop or the run dies."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    threading.Thread(target=_pump_queue, args=(tasks, loop, inbox), daemon=True).start()
    running: set[asyncio.Task] = set()
    try:
        await worker.open()
        while True:
            try:
                msg = await asyncio.wait_for(inbox.get(), PARENT_CHECK_SECONDS)
            except TimeoutError:
                if runner.gone():  # the run was killed: stop, closing every sandbox
                    break
                continue
            if isinstance(msg, Throttle):
                worker.throttle()
                continue
            if not isinstance(msg, Run):
                break
            task = asyncio.ensure_future(_run_and_tell(worker, msg.item))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await worker.close()


async def _run_and_tell(worker: Worker, item: WorkItem) -> None:
    worker.emit(await worker.run_one(item))


def _pump_queue(tasks: Any, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
    while True:
        try:
            msg = tasks.get()
        except (EOFError, OSError):
            msg = Stop()
        loop.call_soon_threadsafe(inbox.put_nowait, msg)
        if isinstance(msg, Stop):
            return


def worker_main(number: int, config_data: dict[str, Any], api_key: str | None, tasks: Any, results: Any,
                context: dict[str, Any], loops: int, sandboxes: int, runner_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    config = RunConfig.model_validate(config_data)
    backend_class(config.backend).enter_worker()  # one thread so far
    runner = RunnerWatch(runner_pid)

    async def main() -> None:  # the clients are made inside the event loop they will use
        await serve(Worker(number, config, api_key, context, loops, sandboxes, emit=results.put), tasks, runner)

    _watch_children_with_pidfds()
    try:
        asyncio.run(main())
    except Exception as exc:
        results.put(Fatal(number, f"worker {number} crashed: {type(exc).__name__}: {exc}"))
    if runner.gone():
        # nobody reads the results any more: exiting must not wait to flush them into a full pipe
        # (it did, and workers of a killed run lived on)
        results.cancel_join_thread()
        return
    results.put(Exited(number))


def _watch_children_with_pidfds() -> None:
    """Python 3.11 waits for each sandbox command in a thread of its own (started and ended per
    command); a pidfd in the event loop does it without one. Python 3.12 does this by itself."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))  # the kernel must have it too (Linux 5.3)
    except OSError:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
