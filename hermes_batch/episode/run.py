"""One prompt from start to record: its sandbox, the task's starting state, the agent, the checks,
the verdict (docs/verification.md).

    sandbox → files and setup → agent → checks, in the same sandbox → record → sandbox closed

The checks run whatever stopped the agent (a final answer, --max_turns, --prompt_timeout). The
record is written only after them, so a run killed in between runs the prompt again on --resume.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..agent import AGENT_SYSTEM_PROMPT, api_messages_for, run_agent
from ..backends import Backend, Sandbox, SandboxError, SandboxSpec
from ..checks import CheckResult, Judge, Task, Verdict, check_answer, check_command, verdict, write_files
from ..config import RunConfig
from ..harness import drive, fill, threads
from ..llm import FatalRunError, ModelClient, PromptFailed
from ..record import (
    AgentRun,
    Outcome,
    build_record,
    discarded,
    failure,
    has_reasoning,
    image_files,
    kept,
    sample_seed,
    usage_totals,
)
from ..store import workspace
from ..tokens import TokenTrace
from ..tools import ToolContext, openai_schema
from ..tools.mcp import McpUnavailable, start_row_servers
from ..util import parse_size
from .wire import Fatal, Finished, WorkItem


def system_prompt_for(config: RunConfig) -> str:
    return AGENT_SYSTEM_PROMPT + (f"\n\n{config.ephemeral_system_prompt}" if config.ephemeral_system_prompt else "")


def prefill_for(config: RunConfig) -> list[dict[str, str]]:
    return [m.model_dump() for m in config.prefill_messages or []]


def opening(config: RunConfig, toolsets: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the first request of every agent offered these toolsets starts with, before its prompt."""
    messages = api_messages_for("", system_prompt_for(config), prefill_for(config))[:-1]
    return messages, [openai_schema(t) for t in config.tools(toolsets)]


@dataclass
class Host:
    """What a worker lends each of its episodes."""

    number: int  # the worker's
    config: RunConfig
    backend: Backend
    llm: ModelClient
    sandboxes: asyncio.Semaphore  # the worker's share of --max_sandboxes
    context: dict[str, Any]  # run facts stamped on every record (fingerprint, backend, ...)
    system_prompt: str
    prefill: list[dict[str, str]]
    records_image: bool
    toolsets: dict[str, Any] = field(default_factory=dict)  # what the worker opened of each toolset (tools/toolset.py)
    fetch_http: Any = None  # the guarded client for model-chosen URLs
    judge: Judge | None = None  # grades rubrics
    note: Callable[[str], None] | None = None  # tells the user something once (the run says each text once)
    intercept: Any = None  # --agent: the model endpoint its harnesses call (harness/intercept.py)


class LazySandbox:
    """Starts the prompt's sandbox in the background (overlapping the first model call), under
    the worker's sandbox limit, and always closes it."""

    def __init__(self, backend: Backend, spec: SandboxSpec, gate: asyncio.Semaphore,
                 note: Callable[[str], None] | None = None):
        self.backend, self.spec, self.gate, self.note = backend, spec, gate, note
        self.sandbox: Sandbox | None = None
        self.start_seconds: float | None = None
        self._task: asyncio.Task | None = None
        self._holding = False

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._start())

    async def _start(self) -> Sandbox:
        await self.gate.acquire()
        self._holding = True
        t0 = time.monotonic()
        self.sandbox = sandbox = await self.backend.start(self.spec)
        self.start_seconds = time.monotonic() - t0
        if (say := self.note) is not None:
            for said in sandbox.start_notes():
                say(f"note: image {self.spec.image or 'default'}: {said}")
        return self.sandbox

    async def get(self) -> Sandbox:
        self.start()
        assert self._task is not None
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


def sandbox_spec(prompt_id: str, image: str | None, cwd: str | None, task: Task | None, config: RunConfig,
                 labels: dict[str, str] | None = None) -> SandboxSpec:
    """What a prompt's sandbox is asked (one home: the run, --check_baseline, validate, recheck): its
    image and work directory (the row's, else its task's: PromptRecord.sandbox_image), and its task's own variables and limits (a Harbor task's, where they
    are above the run's)."""
    memory = task.memory if task and task.memory and parse_size(task.memory) > parse_size(config.sandbox.memory) else None
    cpus = task.cpus if task and task.cpus and task.cpus > config.sandbox.cpus else None
    return SandboxSpec(prompt_id=prompt_id, image=image, cwd=cwd, labels=labels or {},
                       env=dict(task.env) if task else {}, memory=memory, cpus=cpus,
                       image_root=bool(task and task.harbor_task))


async def run_episode(host: Host, item: WorkItem) -> Finished | Fatal:
    """Run one prompt to its end; what to tell the run (never raises but for cancellation)."""
    config, task = host.config, item.task
    started = time.monotonic()
    tools = config.tools(item.toolsets)
    spec = sandbox_spec(item.id, item.image, item.cwd, task, config, {"hermes-batch.prompt-id": item.id})
    sandbox = LazySandbox(host.backend, spec, host.sandboxes, host.note)
    baseline_first = bool(task and task.check and config.check_baseline)
    if not baseline_first and (not host.backend.starts_cheaply or (task and task.needs_sandbox_first)):
        sandbox.start()  # alongside the first model call
    ctx = ToolContext(get_sandbox=sandbox.get, command_timeout=config.command_timeout, toolsets=host.toolsets,
                      fetch_http=host.fetch_http)
    run = AgentRun(tokens=TokenTrace(mode=config.tokens) if config.tokens != "off" else None)
    deadline = config.agent_deadline(task)

    def failed(kind: str, message: str, usage: dict[str, Any] | None = None) -> Finished:
        return Finished(host.number, failure(item.id, item.index, item.attempt, kind, message, usage))

    baseline: CheckResult | None = None
    try:
        if task and baseline_first:
            untouched = await _baseline(host, item, task)  # before this prompt holds a sandbox: no deadlock
            if isinstance(untouched, str):
                return failed("setup_failed", untouched)
            baseline = untouched
        if task and task.needs_sandbox_first:
            problem = await starting_state(sandbox, task, config.step_timeout(task))
            if problem:
                return failed("setup_failed", problem)
        if task and task.mcp_servers:  # the row's own servers: their tools are known before the first model call
            try:
                tools = [*tools, *await start_row_servers(ctx, task.mcp_servers)]
            except McpUnavailable as exc:
                return failed("mcp_unavailable", str(exc))
        saved_prompt = AGENT_SYSTEM_PROMPT  # as saved: never the ephemeral part
        try:
            if config.harness is None:
                await asyncio.wait_for(run_agent(
                    item.prompt, tools, host.llm, ctx, max_turns=config.max_turns, system_prompt=host.system_prompt,
                    prefill=host.prefill, first_tool_choice=config.first_tool_choice, run=run,
                    seed=sample_seed(item.prompt_id, item.sample) if item.samples > 1 else None, model=item.model,
                ), deadline)
            else:  # its own system prompt and tools are what the model saw, and what the record keeps
                saved_prompt, tools = await asyncio.wait_for(_harness(host, item, run, sandbox, deadline),
                                                             deadline + HARNESS_GRACE)
        except TimeoutError:
            run.stop_reason = "prompt_timeout"
            run.drop_unanswered_turn()
            # nothing usable was done in time; a command check still judges the state it left, as Harbor's does
            if not run.assistant_turns() and not (task and task.check):
                limit = "--prompt_timeout" if deadline == config.prompt_timeout else "the task's [agent] timeout_sec"
                return failed("prompt_timeout", f"no reply within {limit}={deadline:g} s",
                              usage_totals(run.calls))
        await ctx.close()  # its MCP sessions end with the agent, before the check
        work_tree = await _save_workspace(sandbox, config) if config.save_workspace else None
        result = await _verify(host, item, run, sandbox) if task and task.checked else verdict([], config.pass_score)
        result.baseline = baseline
        result.check_version = task.version if task and task.checked else None
    except FatalRunError as exc:
        return Fatal(host.number, str(exc))
    except PromptFailed as exc:
        return failed(exc.kind, str(exc), usage_totals(exc.calls))
    except SandboxError as exc:
        return failed("sandbox_error", str(exc))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return failed("internal_error", "".join(traceback.format_exception(exc))[-4000:])
    finally:
        try:
            await ctx.close()
            await sandbox.close()
        finally:
            ctx.release()  # the prompt's browser place, even when closing its sandbox failed
    try:
        return Finished(host.number, _outcome(host, item, run, tools, sandbox, result, started, work_tree, saved_prompt))
    except Exception as exc:  # the run must hear of every prompt, or it waits for it forever
        return failed("internal_error", "".join(traceback.format_exception(exc))[-4000:])


HARNESS_GRACE = 30.0  # seconds past the deadline for a harness killed at it to be read and closed
EXEC_MARGIN = 60.0  # seconds for the short commands around a check (result directory, files, listing)


async def _save_workspace(sandbox: LazySandbox, config: RunConfig) -> bytes | str:
    """The agent's final work tree, its processes ended first so it is whole; or why there is none."""
    if not sandbox.started:
        return "the agent started no sandbox: its work directory held nothing"
    try:
        box = await sandbox.get()
        try:
            await box.end_processes()
        except SandboxError:
            pass  # a backend that cannot (local without isolation): the tree as it is now
        return await workspace.take(box, parse_size(config.workspace_limit))
    except SandboxError as exc:
        return str(exc)


def time_budget(config: RunConfig, item: WorkItem) -> float:
    """The longest an episode may take by its own limits (its agent, setup, baseline, checks and
    their retries): past it, with a grace, the run's watchdog takes its worker for stuck."""
    task = item.task
    agent = config.agent_deadline(task)
    saved = workspace.TAR_TIMEOUT + EXEC_MARGIN if config.save_workspace else 0.0
    if task is None:
        return agent + saved
    step = config.step_timeout(task)
    tries = 1 + config.check_retries
    setup = step + EXEC_MARGIN if task.needs_sandbox_first else 0.0
    check = tries * (step + EXEC_MARGIN) if task.check else 0.0
    baseline = setup + step + EXEC_MARGIN if task.check and config.check_baseline else 0.0
    judge = tries * config.request_timeout if task.rubric else 0.0
    return agent + setup + check + baseline + judge + saved


async def _baseline(host: Host, item: WorkItem, task: Task) -> CheckResult | str:
    """The check on the task's untouched starting state, in a fresh sandbox of its own (or why its
    setup failed)."""
    spec = sandbox_spec(f"{item.id}-baseline", item.image, item.cwd, task, host.config,
                        {"hermes-batch.prompt-id": item.id})
    return await check_afresh(host.backend, host.sandboxes, spec, task, host.config)


async def check_afresh(backend: Backend, gate: asyncio.Semaphore, spec: SandboxSpec, task: Task, config: RunConfig,
                       before_check: Callable[[Sandbox, float], Awaitable[CheckResult | None]] | None = None,
                       ) -> CheckResult | str:
    """The task's check in a fresh sandbox of its own: its starting state, then `before_check` (a
    reference solution, a saved work tree; a result it returns ends there), then the check; or
    why its setup failed. --check_baseline, validate and recheck."""
    timeout = config.step_timeout(task)
    sandbox = LazySandbox(backend, spec, gate)
    try:
        problem = await starting_state(sandbox, task, timeout)
        if problem:
            return problem
        box = await sandbox.get()
        if before_check is not None:
            ended = await before_check(box, timeout)
            if ended is not None:
                return ended
        return await check_command(box, task, timeout, config.pass_score)
    finally:
        await sandbox.close()


async def checked_afresh(backend: Backend, gate: asyncio.Semaphore, spec: SandboxSpec, task: Task, config: RunConfig,
                         before_check: Any = None) -> CheckResult:
    """`check_afresh`, whatever went wrong told as the check's error (validate, recheck)."""
    try:
        result = await check_afresh(backend, gate, spec, task, config, before_check)
    except SandboxError as exc:
        return CheckResult("command", "error", error=f"the sandbox failed: {exc}")
    return CheckResult("command", "error", error=result) if isinstance(result, str) else result


async def starting_state(sandbox: LazySandbox, task: Task, timeout: float) -> str | None:
    """Write the task's files and run its setup; why that failed, or None. Before any model call."""
    box = await sandbox.get()
    if not task.needs_sandbox_first:
        return None
    await write_files(box, task.files)
    if task.setup:
        res = await box.exec(task.setup, language="shell", timeout=timeout)
        if not res.ok:
            why = "timed out" if res.timed_out else f"exited {res.exit_code}"
            return f"the row's setup {why}: {(res.stderr or res.stdout).strip()[-2000:]}"
    return None


async def _verify(host: Host, item: WorkItem, run: AgentRun, sandbox: LazySandbox) -> Verdict:
    """Every check the task carries, each run again while it errs (--check_retries)."""
    config, task = host.config, item.task
    assert task is not None
    checks = []
    if task.check:
        async def command() -> CheckResult:
            try:
                box = await sandbox.get()
            except SandboxError as exc:
                return CheckResult("command", "error", error=f"the sandbox failed: {exc}")
            return await check_command(box, task, config.step_timeout(task), config.pass_score)

        checks.append(await _retried(command, config.check_retries))
    if task.expected is not None:
        checks.append(check_answer(task, run.final_answer))
    if task.rubric:
        judge, rubric = host.judge, task.rubric
        assert judge is not None
        checks.append(await _retried(lambda: judge.grade(item.prompt, rubric, run, config.pass_score),
                                     config.check_retries))
    return verdict(checks, config.pass_score)


async def _retried(check: Callable[[], Awaitable[CheckResult]], retries: int) -> CheckResult:
    result = await check()
    for attempt in range(2, retries + 2):
        if result.status != "error":
            break
        result = await check()
        result.attempts = attempt
    return result


async def _harness(host: Host, item: WorkItem, run: AgentRun, sandbox: LazySandbox,
                   deadline: float) -> tuple[str, list[Any]]:
    """The run's harness drives the prompt in its sandbox; `run` filled from its model calls. (The
    system prompt and tools it sent, as the record keeps them.)"""
    config, harness = host.config, host.config.harness
    assert harness is not None and host.intercept is not None
    box = await sandbox.get()
    line = await host.intercept.open(box, trace=run.tokens, model=item.model)
    done = ending = None
    try:
        done, ending = await drive(harness, line, box, prompt=item.prompt, task_id=item.id, model=config.model_label,
                                   toolsets=item.toolsets, max_calls=config.max_turns, timeout=deadline,
                                   home=item.task.agent_home if item.task else None)
    finally:
        await line.close()
        system, offered = fill(run, line.calls, ending)
        run.harness = {"agent": config.harness_release, "calls": len(line.calls), "threads": threads(line.calls),
                       "exit_code": done.exit_code if done is not None else None,
                       "ended": ending.status if ending is not None else None}  # in the harness's own words
        if done is not None and done.timed_out:
            run.stop_reason = "prompt_timeout"  # ended by the deadline, not by its own limit
    if line.fatal is not None:
        raise line.fatal
    said = (done.stderr or done.stdout).strip()[-1500:] if done is not None else ""
    crashed = done is not None and not done.timed_out and done.exit_code != 0 and run.stop_reason == "harness_stopped"
    if not run.transcript or crashed:  # no answer, and a harness that died mid-task gives none
        why = ("it asked for tools and died before it saw their results" if crashed else
               line.calls[-1].error if line.calls else "it never called the model")
        failed = PromptFailed("harness_failed", f"{harness.name} ended (exit {done.exit_code if done else '?'}) after "
                                                f"{len(line.calls)} model calls: {why}" + (f"; it said: {said}" if said else ""))
        failed.calls = run.calls
        raise failed
    return system, [Offered(t) for t in offered if isinstance(t, dict)]


class Offered:
    """A tool a harness offered the model, as it described it (kept in the record, counted in tool_stats)."""

    def __init__(self, schema: dict[str, Any]):
        fn = schema.get("function") or {}
        self.name = str(fn.get("name") or "?")
        self.description = str(fn.get("description") or "")
        self.parameters = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {"type": "object"}
        self.toolset = "harness"


def _outcome(host: Host, item: WorkItem, run: AgentRun, tools: list[Any], sandbox: LazySandbox,
             result: Verdict, started: float, work_tree: bytes | str | None = None,
             system_prompt: str = AGENT_SYSTEM_PROMPT) -> Outcome:
    """A finished agent loop as a kept or discarded record."""
    config = host.config
    record = build_record(
        prompt_id=item.id, prompt_index=item.index, batch_num=item.batch_num, run=run, tools=tools,
        system_prompt=system_prompt,
        sample_of=(item.prompt_id, item.sample, item.samples),
        toolsets=[*item.toolsets, *(item.task.mcp_servers if item.task else ())], model=item.model or config.model_label, extra=item.extra, verification=result.to_json(),
        context={
            **host.context,
            "image": (item.image or config.sandbox.image) if host.records_image else None,
            "attempt": item.attempt,
            "timings": {
                "total_seconds": round(time.monotonic() - started, 3),
                "sandbox_start_seconds": round(sandbox.start_seconds, 3) if sandbox.start_seconds else None,
                "check_seconds": round(result.seconds, 3) if result.checks else None,
            },
            # --save_workspace: where the agent's final work tree is kept (store/run_store.py writes it), or why not
            "workspace": None if work_tree is None else {"error": work_tree} if isinstance(work_tree, str)
            else {"file": workspace.file_name(item.id), "bytes": len(work_tree)},
        },
    )
    if config.require_reasoning and not any(has_reasoning(m) for m in run.assistant_turns()):
        outcome = discarded(record, "no_reasoning")
    else:
        outcome = kept(record)
        outcome.workspace = work_tree if isinstance(work_tree, bytes) else None
    # a harness's side threads name images too (the record keeps every thread whole)
    outcome.images = image_files([*run.transcript, *(m for t in run.side_threads for m in t["transcript"])]) or None
    for check in result.checks:  # the judge's spend counts toward --max_cost and --max_total_tokens
        if check.usage:
            outcome.tokens += int(check.usage.get("total_tokens") or 0)
            if check.usage.get("cost") is not None:
                outcome.cost = (outcome.cost or 0.0) + float(check.usage["cost"])
    return outcome
