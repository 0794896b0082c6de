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
from collections.abc import Callable
from typing import Any

from ..backends import Backend, backend_class, uses_images
from ..config import RunConfig, open_backend
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
from ..llm import open_client
from ..util import AdaptiveLimit

PARENT_CHECK_SECONDS = 0.5


class Worker:
    def __init__(self, number: int, config: RunConfig, api_key: str | None, context: dict[str, Any],
                 loops: int, sandboxes: int, emit: Callable[[FromWorker], None], judge_key: str | None = None,
                 media_keys: dict[str, str] | None = None):
        self.number = number
        self.config = config
        self.api_key = api_key
        self.media_keys = media_keys if media_keys is not None else config.media_keys()
        self.emit = emit
        self.system_prompt = system_prompt_for(config)
        self.prefill = prefill_for(config)
        self.backend: Backend = open_backend(config)
        self.loops = asyncio.Semaphore(loops)
        self.sandboxes = asyncio.Semaphore(sandboxes)
        self.browsers = asyncio.Semaphore(config.browsers_for(sandboxes))  # held from a prompt's first browser call
        self.limit = AdaptiveLimit(loops, on_cut=lambda: emit(RateLimited(number)))
        self.llm = open_client(config.model_settings(), api_key, self.limit)
        self.http: Any = None  # the web provider's client and its guarded twin for model-chosen URLs
        self.fetch_http: Any = None
        self.web: Any = None  # the web provider, when the run has one
        self.guard_proxy: Any = None  # --network: the sandboxes' way out (tools/guard_proxy.py)
        # what each episode (episode/run.py) is lent
        self.judge = config.judge(api_key, judge_key)
        self.host = Host(number, config, self.backend, self.llm, self.sandboxes, context, self.system_prompt,
                         self.prefill, uses_images(config.backend), judge=self.judge,
                         note=lambda text: emit(Note(number, text)), browsers=self.browsers)

    async def open(self) -> None:
        config, provider = self.config, self.config.web_provider_name
        if config.sandbox.network:  # every sandbox's one way out, placed in its own network (backends/egress.py)
            from ..backends.egress import EGRESS_URL
            from ..tools.guard_proxy import GuardProxy

            self.guard_proxy = self.backend.egress = GuardProxy()
            self.host.browser_proxy = EGRESS_URL
        await self.backend.setup()
        speaks = "tts" in config.offered_toolsets()
        if provider or config.vision_model or config.image_provider or speaks:
            import httpx

            from ..tools.netguard import guarded_client

            self.http = httpx.AsyncClient(timeout=120, headers={"user-agent": "hermes-batch"})
            self.fetch_http = guarded_client(timeout=30, headers={"user-agent": "hermes-batch"})
            self.host.fetch_http = self.fetch_http
        if provider:
            from ..tools import providers

            self.web = providers.make(provider, config.web_base_url, self.http,
                                      on_note=lambda text: self.emit(Note(self.number, text)))
            self.host.web = self.web
        from ..tools.vision import NATIVE, MainModelLooks, VisionClient

        if config.vision_model == NATIVE:
            self.host.vision = MainModelLooks()
        elif config.vision_model:
            # the run's own key only goes to the run's own endpoint
            same = not config.vision_base_url or config.vision_base_url.rstrip("/") == config.base_url.rstrip("/")
            key = self.media_keys.get("vision") or (self.api_key if same else None)
            self.host.vision = VisionClient(config.vision_base_url or config.base_url, config.vision_model, key, self.http)
        if config.image_provider:
            from ..tools.image_gen import make_provider

            self.host.images = make_provider(config.image_provider, config.image_base_url, config.image_model,
                                             self.media_keys.get("image"), self.http, self.fetch_http)
        if speaks:
            from ..tools.tts import make_speech

            self.host.speech = make_speech(config.tts_provider, config.tts_base_url, config.tts_model,
                                           config.tts_voice, self.media_keys.get("tts"), self.http)

    async def close(self) -> None:
        if self.guard_proxy is not None:
            await self.guard_proxy.close()
        await self.llm.close()
        await self.judge.close()
        for client in (self.http, self.fetch_http):
            if client is not None:
                await client.aclose()
        await self.backend.shutdown()

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
