"""A worker process: many agent loops on one asyncio event loop, results streamed to the parent.

Protocol (multiprocessing queues):
    parent → worker   ("run", item) | ("stop", None)
    worker → parent   ("ready", n) | ("done"|"discarded"|"failed", n, summary, line) |
                      ("fatal", n, message) | ("log", n, text) | ("exited", n)
`line` is the JSON line to append, already encoded here so the single writer stays cheap.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from backends import Backend, SandboxError, SandboxSpec, load_backend

from .agent import AGENT_SYSTEM_PROMPT, AgentRun, has_reasoning, run_agent
from .config import RunConfig, backend_settings
from .limits import AdaptiveLimit
from .llm import ChatClient, FatalRunError, PromptFailed
from .store import dumps, now_iso
from .tools import ToolContext, tools_for
from .trajectory import build_record, usage_totals

PARENT_CHECK_SECONDS = 0.5


@dataclass
class WorkItem:
    id: str
    index: int
    prompt: str
    toolsets: list[str]
    batch_num: int
    image: str | None = None
    cwd: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1


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
    def __init__(self, number: int, config: RunConfig, api_key: str | None, results, context: dict[str, Any],
                 loops: int, sandboxes: int):
        self.number = number
        self.loop_limit, self.sandbox_limit = loops, sandboxes
        self.config = config
        self.api_key = api_key
        self.results = results
        self.context = context  # run facts stamped on every record (fingerprint, backend, ...)
        self.system_prompt = AGENT_SYSTEM_PROMPT + (
            f"\n\n{config.ephemeral_system_prompt}" if config.ephemeral_system_prompt else ""
        )
        self.prefill = [m.model_dump() for m in config.prefill_messages or []]

    def send(self, *msg: Any) -> None:
        self.results.put(msg)

    async def serve(self, tasks) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=_pump_queue, args=(tasks, loop, inbox), daemon=True).start()
        self.backend = load_backend(self.config.backend, backend_settings(self.config))
        await self.backend.setup()
        self.loops = asyncio.Semaphore(self.loop_limit)
        self.sandboxes = asyncio.Semaphore(self.sandbox_limit)
        self.llm = ChatClient(self.config, self.api_key, AdaptiveLimit(self.loop_limit))
        self.http = self.fetch_http = None
        if self.config.web_search_url:
            import httpx

            from .tools.netguard import guarded_client

            self.http = httpx.AsyncClient(timeout=30, headers={"user-agent": "hermes-batch"})
            self.fetch_http = guarded_client(timeout=30, headers={"user-agent": "hermes-batch"})
        running: set[asyncio.Task] = set()
        parent = os.getppid()
        self.send("ready", self.number)
        try:
            while True:
                try:
                    kind, item = await asyncio.wait_for(inbox.get(), PARENT_CHECK_SECONDS)
                except asyncio.TimeoutError:
                    if os.getppid() != parent:  # the parent was killed: stop, closing every sandbox
                        break
                    continue
                if kind != "run":
                    break
                task = asyncio.ensure_future(self.run_one(WorkItem(**item)))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self.llm.close()
            for client in (self.http, self.fetch_http):
                if client is not None:
                    await client.aclose()
            await self.backend.shutdown()
            self.send("exited", self.number)

    async def run_one(self, item: WorkItem) -> None:
        async with self.loops:
            started = time.monotonic()
            tools = tools_for(item.toolsets)
            spec = SandboxSpec(prompt_id=item.id, image=item.image, cwd=item.cwd,
                               labels={"hermes-batch.prompt-id": item.id})
            sandbox = LazySandbox(self.backend, spec, self.sandboxes)
            sandbox.start()
            ctx = ToolContext(get_sandbox=sandbox.get, command_timeout=self.config.command_timeout,
                              web_search_url=self.config.web_search_url, http=self.http, fetch_http=self.fetch_http)
            run = AgentRun()
            try:
                await asyncio.wait_for(run_agent(
                    item.prompt, tools, self.llm, ctx, max_turns=self.config.max_turns,
                    system_prompt=self.system_prompt, prefill=self.prefill,
                    first_tool_choice=self.config.first_tool_choice, run=run,
                ), self.config.prompt_timeout)
            except asyncio.TimeoutError:
                run.stop_reason = "prompt_timeout"
                run.drop_unanswered_turn()
                if not run.assistant_turns():  # nothing usable was done in time
                    self._failed(item, "prompt_timeout", f"no reply within --prompt_timeout={self.config.prompt_timeout:g} s",
                                 usage_totals(run.calls))
                    return
            except FatalRunError as exc:
                self.send("fatal", self.number, str(exc))
                return
            except PromptFailed as exc:
                self._failed(item, exc.kind, str(exc), usage_totals(exc.calls))
                return
            except SandboxError as exc:
                self._failed(item, "sandbox_error", str(exc))
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(item, "internal_error", "".join(traceback.format_exception(exc))[-4000:])
                return
            finally:
                await sandbox.close()
            try:
                kind, summary, line = self._outcome(item, run, tools, sandbox, started)
            except Exception as exc:  # the parent must hear of every prompt, or the run waits for it forever
                self._failed(item, "internal_error", "".join(traceback.format_exception(exc))[-4000:])
                return
            self.send(kind, self.number, summary, line)

    def _outcome(self, item: WorkItem, run, tools, sandbox: LazySandbox, started: float) -> tuple[str, dict, bytes]:
        """(done | discarded, summary, the JSON line) for a finished agent loop."""
        record = build_record(
            prompt_id=item.id, prompt_index=item.index, batch_num=item.batch_num, run=run, tools=tools,
            toolsets=item.toolsets, model=self.config.model_label, extra=item.extra,
            context={
                **self.context,
                "image": (item.image or self.config.image) if self.config.backend != "local" else None,
                "attempt": item.attempt,
                "timings": {
                    "total_seconds": round(time.monotonic() - started, 3),
                    "sandbox_start_seconds": round(sandbox.start_seconds, 3) if sandbox.start_seconds else None,
                },
            },
        )
        summary = {
            "id": item.id, "index": item.index,
            "tokens": record["metadata"]["usage"]["total_tokens"], "cost": record["metadata"]["usage"].get("cost"),
            "completed": record["completed"],
        }
        if self.config.require_reasoning and not any(has_reasoning(m) for m in run.assistant_turns()):
            record["discarded"] = summary["reason"] = "no_reasoning"
            return "discarded", summary, dumps(record)
        return "done", summary, dumps(record)

    def _failed(self, item: WorkItem, kind: str, message: str, usage: dict[str, Any] | None = None) -> None:
        self.send("failed", self.number, *failure(item, kind, message, usage))


def failure(item: WorkItem, kind: str, message: str, usage: dict[str, Any] | None = None) -> tuple[dict, bytes]:
    """(the summary for the parent, the failed.jsonl line) of a prompt that failed, with what it spent."""
    usage = usage or usage_totals([])
    entry = {"id": item.id, "prompt_index": item.index, "attempt": item.attempt, "error_kind": kind,
             "error": message, "usage": usage, "timestamp": now_iso()}
    summary = {"id": item.id, "index": item.index, "kind": kind, "error": message,
               "tokens": usage.get("total_tokens", 0), "cost": usage.get("cost")}
    return summary, dumps(entry)


def _pump_queue(tasks, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
    while True:
        try:
            msg = tasks.get()
        except (EOFError, OSError):
            msg = ("stop", None)
        loop.call_soon_threadsafe(inbox.put_nowait, msg)
        if msg[0] != "run":
            return


def worker_main(number: int, config_data: dict[str, Any], api_key: str | None, tasks, results,
                context: dict[str, Any], loops: int, sandboxes: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    config = RunConfig.model_validate(config_data)
    worker = Worker(number, config, api_key, results, context, loops, sandboxes)
    try:
        asyncio.run(worker.serve(tasks))
    except Exception as exc:
        results.put(("fatal", number, f"worker {number} crashed: {type(exc).__name__}: {exc}"))
        results.put(("exited", number))
