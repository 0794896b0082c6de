"""Agent loops on one asyncio event loop, in a process of the pool or a Ray actor.

A `Worker` runs each `WorkItem` it is given and tells `emit` how it settled (episode/wire.py), once per
item whatever happens: the run waits for exactly that. `worker_main` is the pool process around it.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import threading
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from ..backends import Backend, backend_class, uses_images
from ..config import RunConfig
from ..episode import (
    Exited,
    Fatal,
    Finished,
    FromWorker,
    Host,
    Note,
    RateLimited,
    Run,
    Stop,
    Throttle,
    WorkItem,
    prefill_for,
    run_episode,
    system_prompt_for,
)
from ..harness import Intercept
from ..llm import open_client
from ..tools import Opening, Toolset, close_all
from ..util import AdaptiveLimit
from .sandboxes import open_backend, set_up

PARENT_CHECK_SECONDS = 0.5


class Worker:
    def __init__(self, number: int, config: RunConfig, api_key: str | None, context: dict[str, Any],
                 loops: int, sandboxes: int, emit: Callable[[FromWorker], None], judge_key: str | None = None,
                 toolset_keys: dict[str, str] | None = None):
        self.number = number
        self.config = config
        self.api_key = api_key
        self.emit = emit
        self.system_prompt = system_prompt_for(config)
        self.prefill = prefill_for(config)
        self.backend: Backend = open_backend(config)
        self.loops = asyncio.Semaphore(loops)
        self.sandboxes = asyncio.Semaphore(sandboxes)
        self.limit = AdaptiveLimit(loops, on_cut=lambda: emit(RateLimited(number)))
        self.llm = open_client(config.model_settings(), api_key, self.limit)
        self._shut_down: Callable[[], Awaitable[None]] | None = None  # the backend's (and its guard's), once set up
        # the toolsets it opens: their keys (read by the parent, which may be on another machine), their handles
        self.opening = Opening(config, toolset_keys if toolset_keys is not None else config.toolset_keys(), api_key,
                               sandboxes, config.sandbox.network, note=lambda text: emit(Note(number, text)))
        self.opened: dict[str, tuple[Toolset, Any]] = {}
        # what each episode (episode/run.py) is lent
        self.judge = config.judge(api_key, judge_key)
        self.host = Host(number, config, self.backend, self.llm, self.sandboxes, context, self.system_prompt,
                         self.prefill, uses_images(config.backend), judge=self.judge,
                         note=lambda text: emit(Note(number, text)))
        if config.harness is not None:  # each prompt's harness calls its model here, served into its sandbox
            self.host.intercept = Intercept(self.llm, config.max_turns, config.model_label)

    async def open(self) -> None:
        config = self.config
        self._shut_down = await set_up(self.backend, config)
        plugins = config.plugins()
        for name, use in config.toolset_uses().items():
            toolset = plugins[name]
            if toolset.wanted(config, use == "offered"):
                self.opened[name] = (toolset, await toolset.open(self.opening))
        self.host.toolsets = {name: handle for name, (_, handle) in self.opened.items()}
        if any(handle is not None for _, handle in self.opened.values()):  # a toolset that reaches out
            self.host.fetch_http = self.opening.fetch_http

    async def close(self) -> None:
        await self.llm.close()
        await self.judge.close()
        await close_all(self.opened)
        await self.opening.close()
        if self._shut_down is not None:
            await self._shut_down()

    def throttle(self) -> None:
        self.limit.rate_limited(shared=True)

    async def run_one(self, item: WorkItem) -> Finished | Fatal:
        """Run one prompt to its end; what to tell the run (never raises but for cancellation)."""
        async with self.loops:
            return await run_episode(self.host, item)


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
