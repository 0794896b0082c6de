"""A run, from a validated config to its files: `run(config)` is the whole of it.

It checks what can be checked before any token is spent (dataset, run directory, settings of an
earlier run, endpoint, backend, images), plans the prompts still owed, hands them to an executor
and writes every outcome itself (the single writer), then merges and computes the statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Protocol

from tqdm import tqdm

from .. import distributions
from ..backends import Backend, BackendUnavailable, ImageUnavailable, SandboxError, SandboxSpec, backend_class
from ..config import ConfigError, RunConfig, check_fingerprint, check_same_dataset, fingerprint, reused_name
from ..dataset import Dataset, DatasetError, read_source
from ..episode import WorkItem, opening, time_budget
from ..errors import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_SOME_FAILED, RunAborted, UserError
from ..llm import check_endpoint
from ..llm.local_model import embedded_endpoint
from ..record import Outcome, each_sample, failure, index_of_samples, now_iso
from ..stats import Statistics
from ..store import DATASET_INDEX, LEDGER, RunState, RunStore, disk_full
from ..store.key_prints import record_keys
from ..tools import REGISTRY, why_not_offered
from ..tools.mcp import McpError, McpServer, McpUnavailable, new_session
from ..tools.netguard import guarded_client
from ..util import say
from . import recheck, rejudge
from .breaker import OutageBreaker
from .executor import Executor, ProcessPool, stop_fork_server, warm_up
from .plan import Plan, plan_work
from .sandboxes import backend_session

CHECKPOINT_EVERY = 2.0  # seconds; the batch files are the truth, the checkpoint a summary
# seconds between group commits: one fsync per file for every outcome that came in meanwhile (a
# crash loses at most this much finished work, which --resume runs again)
COMMIT_EVERY = 0.1
STOP_GRACE = 30.0  # seconds workers get to close their sandboxes when the run stops
PROGRESS_EVERY = 10.0  # seconds between progress lines where stderr is no terminal (tqdm draws no bar there)
WATCHDOG_GRACE = 10.0  # seconds past --prompt_timeout (at least; a quarter of it for long limits)
# failures that say the endpoint is down, not that the prompt is bad
OUTAGE_KINDS = {"endpoint_unreachable", "timeout", "server_error", "rate_limited", "bad_response"}
# failures the runner records itself, which say nothing about the endpoint either way
RUNNER_KINDS = {"image_unavailable", "watchdog", "worker_died"}


@dataclass
class RunResult:
    """What an invocation did, for the report and the exit code."""

    config: RunConfig
    counts: Counter
    stats: Statistics
    outstanding: int  # prompts of the dataset not settled (failed or never run)
    failed_outstanding: int
    trajectories_path: Any
    statistics_path: Any
    aborted: RunAborted | None = None
    merged: bool = True  # trajectories.jsonl and statistics.json are up to date

    @property
    def exit_code(self) -> int:
        if self.aborted is not None:
            return self.aborted.code
        return EXIT_SOME_FAILED if self.outstanding else EXIT_OK


# --- the entry point -----------------------------------------------------------------------
def run(config: RunConfig, rescore: bool = False) -> RunResult:
    """Run (or resume) the prompts `config` names; or, `rescore`, run no agent and score the run's
    trajectories again with its dataset's checks (recheck.py). Raises UserError before anything is
    spent when something given is wrong; a run stopped midway returns with `aborted` set."""
    try:
        return _run(config, rescore)
    except (BackendUnavailable, SandboxError, distributions.DistributionError) as exc:
        raise UserError(str(exc)) from exc


def _run(config: RunConfig, rescore: bool) -> RunResult:
    check_tools(config)
    assert config.dataset_file is not None  # configure() requires it
    if config.executor == "local":
        warm_up()
    dataset_index = config.run_dir / DATASET_INDEX  # the dataset's ids, kept for the next --resume

    store = RunStore(config.run_dir)
    new = not config.run_dir.exists()
    store.lock()
    try:
        state = _claim(config, store, rescore)
        try:  # Harbor task directories: the run keeps their rows as its own JSONL
            dataset = read_source(config.dataset_file, config.run_dir, config.max_samples, index=dataset_index)
            if not dataset.ids:
                raise DatasetError(f"{dataset.path} has no usable rows ({len(dataset.problems)} rejected)")
        except DatasetError:
            if new:  # a dataset that cannot be read leaves no run behind
                store.close()
                shutil.rmtree(config.run_dir, ignore_errors=True)
            raise
        if config.max_samples is None and not (dataset.from_index and dataset_index.exists()):
            dataset.write_index(dataset_index)
        plan = plan_work(config, dataset, state)
        if rescore:
            say(f"checking again the trajectories of {config.run_name!r} with the checks of {dataset.path}; no agent "
                "runs, no model is asked")
            counts = asyncio.run(recheck.recheck(config, store, state, dataset))
            say(recheck.summary(counts))
            plan = Plan([], plan.skipped_done, plan.skipped_discarded, 0)
        _announce(config, dataset, plan)
        _check_tasks(config, plan)
        # what needs no model is checked before it starts (the embedded one takes minutes): the
        # backend, leftovers of a killed run, every image; the endpoint once it answers
        problems = asyncio.run(sandboxes_ready(config, {i.image or "": i.build for i in plan.items})) \
            if plan.items else {}
        if plan.items and config.executor == "ray":
            from .ray_executor import check_reachable  # Ray is an optional extra

            check_reachable(config.ray_address)
        unsure = [] if rescore else rejudge.owed(state, store, dataset, config.samples)  # checks that could not say
        outdated = [] if rescore else recheck.stale(state, store, dataset, config.samples)
        if outdated:
            say(f"warning: {len(outdated)} trajectories were scored by checks their rows no longer have (a check, "
                f"expected or rubric edited since): their verdicts are out of date; `python batch_runner.py recheck "
                f"--run_name={config.run_name}` scores them with the checks now (a command check needs the work tree "
                "the run kept with --save_workspace)")
        with contextlib.ExitStack() as serving:
            if config.uses_local_model and (plan.items or unsure):
                # the toolsets most prompts are offered: their agents' opening is read once for every slot
                common = Counter(tuple(item.toolsets) for item in plan.items).most_common(1)
                url = serving.enter_context(embedded_endpoint(
                    config.local_model, threads=config.local_threads, ctx=config.local_ctx,
                    parallel=config.local_parallel, log_path=store.local_model_log, say=say,
                    opening=opening(config, list(common[0][0])) if common and not config.harness else None,
                    exact_cache=config.tokens == "exact"))
                config = config.model_copy(update={"base_url": url})
            if unsure:
                say(f"checking again {len(unsure)} trajectories whose checks could not say (their agents are not run again)")
                counts = asyncio.run(rejudge.rejudge(config, config.resolved_api_key(), store, unsure))
                say(f"  {counts['rechecked']} have a verdict now, {counts['still_error']} still could not be checked"
                    + (f", {counts['needs_sandbox']} keep their error: their check ran in the sandbox, which is gone"
                       if counts["needs_sandbox"] else ""))
            spine = Spine(config, dataset, store, state, config.resolved_api_key())
            spine.write_checkpoint(force=True)
            aborted: RunAborted | None = None
            # made before the pre-flight: a Ray cluster that cannot be reached fails before any token is spent
            executor = spine.executor(len(plan.items)) if plan.items else None
            try:
                items = spine.preflight(plan.items, problems)
                if executor is not None and items:
                    spine.dispatch(items, executor)
            except RunAborted as exc:
                aborted = exc
            finally:
                if executor is not None:
                    executor.stop(STOP_GRACE)
            spine.close_out()
        return spine.finish(aborted)
    finally:
        store.close()
        stop_fork_server()  # reaped: its workers' CPU is the run's (/usr/bin/time), and it never outlives it


def _claim(config: RunConfig, store: RunStore, rescore: bool = False) -> RunState:
    """The run's state, once its name is this invocation's to use: a run that holds trajectories is
    continued only with --resume (never with another dataset, nor other settings, unless
    --allow_config_change), or started again with --overwrite; one that holds none (it stopped
    before its first prompt's end) is started afresh, or resumed with the settings given now."""
    state = store.scan()
    for note in state.repaired:
        say(f"repaired {note}")
    checkpoint = store.read_checkpoint()
    trajectories = len(state.done) + len(state.discarded)
    if store.has_outputs() and not config.resume:
        if trajectories and not config.overwrite:
            raise ConfigError(reused_name(config, checkpoint, trajectories))
        if not trajectories and not config.overwrite:
            say(f"note: {config.run_dir} holds no trajectory (its last invocation ended before any prompt did): "
                "starting it afresh")
        store.clear()
        return store.scan()
    if config.resume and not config.allow_config_change:
        if trajectories and not rescore:  # recheck's fixed dataset scores the run's work again, and adds nothing
            check_same_dataset(config, checkpoint, trajectories)
            check_fingerprint(config, checkpoint, state.fingerprints)
        else:
            try:
                check_fingerprint(config, checkpoint, state.fingerprints)
            except ConfigError:
                say(f"note: {config.run_name!r} holds no trajectory yet, so it goes on with the settings given now")
    return state


def keys_held(config: RunConfig, api_key: str | None) -> dict[str, str | None]:
    """Every key this invocation's runner holds, by where it was read (their prints are kept, never they)."""
    source = "--api_key" if config.api_key is not None else next(
        (v for v in ("OPENROUTER_API_KEY", "OPENAI_API_KEY") if os.environ.get(v)), "api key")
    return {source: api_key, "JUDGE_API_KEY": os.environ.get("JUDGE_API_KEY"),
            **{f"{kind} key": key for kind, key in config.toolset_keys().items()}}


def check_tools(config: RunConfig) -> None:
    """Refuse toolsets that cannot be offered, before a sandbox starts or a token is spent."""
    list_mcp_tools(config)
    if not config.toolsets:
        dist = distributions.get(config.distribution, set(config.plugins()))  # fail now on a bad name, not in a worker
        if left_out := config.toolsets_left_out:
            if not any(p > 0 for t, p in dist.toolsets.items() if t not in left_out):
                raise ConfigError(f"distribution {dist.name!r} offers nothing this run can offer: "
                                  + "; ".join(f"{t}: {why}" for t, why in left_out.items()))
            for toolset, why in left_out.items():
                say(f"note: distribution {dist.name!r} offers no {toolset} tools in this run: {why}")
    else:
        known = config.plugins()
        unknown = [t for t in config.toolsets if t not in known]
        if unknown:
            raise ConfigError(f"unknown toolset(s) in --toolsets: {', '.join(unknown)}; known: {', '.join(known)}")
        for toolset in config.toolsets:
            if lacking := why_not_offered(toolset, config):
                raise ConfigError(f"--toolsets includes {toolset}, but {lacking}; or leave {toolset} out")
    for plugin in REGISTRY.values():  # each refuses what cannot work and says what a user should know
        try:
            plugin.at_start(config, say)
        except UserError as exc:
            raise ConfigError(str(exc)) from None


def list_mcp_tools(config: RunConfig) -> None:
    """The run's MCP servers started once (a stdio one in a sandbox of the run's own), their tools
    listed into `config.mcp_listed`: a server that cannot be used is refused now, by name."""
    try:
        servers: dict[str, McpServer] = config.mcp_servers()
    except McpError as exc:
        raise ConfigError(str(exc)) from None
    if not servers:
        return
    if clash := sorted(set(servers) & set(REGISTRY)):
        raise ConfigError(f"MCP server(s) named like a toolset of the runner's own: {', '.join(clash)}; rename them")
    if config.backend in ("modal", "flame") and (stdio := [n for n, s in servers.items() if s.stdio]):
        raise ConfigError(f"MCP server(s) {', '.join(stdio)} run over stdio in the prompt's sandbox, which the "
                          f"{config.backend} backend cannot keep open: use local, docker or singularity")
    listed, failed = asyncio.run(_listing(config, servers))
    if failed:
        raise ConfigError("\n".join(f"MCP server {name} cannot be used: {why}" for name, why in failed.items()))
    object.__setattr__(config, "mcp_listed", listed)  # not a flag: what the workers offer, and the fingerprint holds
    say("MCP servers: " + ", ".join(f"{name} ({len(tools)} tool{'s' if len(tools) != 1 else ''})"
                                    for name, tools in listed.items()))


async def _listing(config: RunConfig, servers: dict[str, McpServer]) -> tuple[dict[str, list], dict[str, str]]:
    listed: dict[str, list] = {}
    failed: dict[str, str] = {}

    async def one(name: str, server: McpServer, sandbox: Any) -> None:
        try:
            session = new_session(name, server)
        except McpUnavailable as exc:
            failed[name] = str(exc)
            return
        try:
            tools = await session.start(sandbox, lambda headers: guarded_client(timeout=30, headers=headers))
            listed[name] = [t.model_dump(mode="json", exclude_none=True) for t in tools]
            if not tools:
                failed[name] = "it lists no tools"
        except McpUnavailable as exc:
            failed[name] = str(exc)
        finally:
            await session.close()

    for name, server in servers.items():
        if not server.stdio:
            await one(name, server, None)
    if any(s.stdio for s in servers.values()):
        async with backend_session(config) as backend:
            sandbox = await backend.start(SandboxSpec(prompt_id=f"mcp-listing-{os.getpid()}"))
            try:
                for name, server in servers.items():
                    if server.stdio:
                        await one(name, server, sandbox)
            finally:
                await sandbox.close()
    return listed, failed


def _check_tasks(config: RunConfig, plan: Plan) -> None:
    """Say what task.toml settings are not applied; refuse images the backend cannot build."""
    ignored = Counter(field for item in plan.items if item.task for field in item.task.not_applied)
    if ignored:
        say("note: task.toml settings not applied here (docs/verification.md has the table): "
            + ", ".join(f"{field} ({n} task{'s' if n > 1 else ''})" for field, n in sorted(ignored.items())))
    built = sum(1 for item in plan.items if item.build)
    if built and not backend_class(config.backend).builds_images:
        raise ConfigError(f"{built} prompt(s) run in an image built from a Dockerfile (Harbor tasks' "
                          f"environment/), which the {config.backend} backend cannot build: use --backend=docker")


def _announce(config: RunConfig, dataset: Dataset, plan: Plan) -> None:
    parts = [f"{len(dataset)} prompts in {dataset.path}"
             + (f" × {config.samples} samples" if config.samples > 1 else "")]
    if dataset.problems:
        parts.append(f"{len(dataset.problems)} rows rejected")
    if plan.skipped_done or plan.skipped_discarded:
        parts.append(f"{plan.skipped_done} already done, {plan.skipped_discarded} discarded earlier")
    if plan.retried:
        parts.append(f"{plan.retried} failed earlier and will be retried")
    if plan.gave_up:
        parts.append(f"{plan.gave_up} failed {config.max_attempts} times and will not be retried "
                     "(raise --max_attempts to try them again)")
    parts.append(f"{len(plan.items)} to run")
    say("; ".join(parts))
    if config.samples > 1 and config.temperature == 0:
        say("warning: --samples at --temperature=0: the samples of a prompt differ only where the endpoint "
            "honours their seeds")
    where = "the embedded llama.cpp server" if config.uses_local_model else config.base_url
    say(f"model {config.model_label} at {where}; backend {config.backend}; "
        f"{config.num_workers} worker(s), {config.concurrency} agent loops in flight")


# --- where the dispatch loop's work comes from ---------------------------------------------
class Feed(Protocol):
    """What `Spine.drive` is fed: a batch run's plan (`Planned`), or the rollout service's requests as
    they come (rollout/service/rollouts.py)."""

    noun: str  # what one item is to a user: a prompt, a rollout
    wait: float  # seconds the loop waits for an outcome at each turn: how soon it sees what `take` brings
    retries: bool  # what failed while the endpoint was down runs again in this invocation

    @property
    def closed(self) -> bool:
        """No more work will come: the loop ends once what it holds has settled."""

    @property
    def stopped(self) -> bool:
        """The loop ends now; what is in flight is the caller's to stop."""

    def take(self, pending: deque[WorkItem]) -> None:
        """Add to `pending` what came since the last turn, and take out (settled) what will not run."""

    def held_back(self, over: str, pending: deque[WorkItem]) -> None:
        """The budget is spent (`over` says how): no item of `pending` starts."""

    def start(self, pending: deque[WorkItem], executor: Executor) -> bool:
        """Start (or settle) `pending`'s first item; False: nothing starts before an outcome comes."""


class Planned:
    """A batch run's plan: all of it known at the start; what the budget holds back is owed to --resume."""

    noun, wait, retries = "prompt", 0.2, True
    closed, stopped = True, False

    def take(self, pending: deque[WorkItem]) -> None:
        pass

    def held_back(self, over: str, pending: deque[WorkItem]) -> None:
        pass

    def start(self, pending: deque[WorkItem], executor: Executor) -> bool:
        executor.submit(pending.popleft())
        return True


# --- one invocation's work -----------------------------------------------------------------
class Spine:
    """The single writer: feeds an executor, records every outcome, keeps the checkpoint, holds the
    run back during an outage or past its budget, and writes the statistics at the end."""

    def __init__(self, config: RunConfig, dataset: Dataset, store: RunStore, state: RunState, api_key: str | None):
        self.config = config
        self.dataset = dataset
        self.store = store
        self.state = state
        self.api_key = api_key
        self.fingerprinted = config.fingerprint_fields(config.tool_schema())  # what the fingerprint holds
        self.fingerprint = fingerprint(self.fingerprinted)
        self.counts: Counter = Counter()
        self.tokens = 0  # spent in this invocation (the progress bar's tok/s)
        self.started = time.monotonic()
        self.breaker = OutageBreaker(max(5, min(20, config.concurrency)))
        self.requeue: list[WorkItem] = []  # prompts the endpoint failed while it was down: run again
        self._recent_outage_failures: deque[WorkItem] = deque(maxlen=64)
        self._said_no_cost = False
        self._last_watch = 0.0
        self._last_checkpoint = 0.0
        self._last_commit = 0.0
        self._last_progress = 0.0
        self._uncommitted = False  # outcomes written but not yet fsynced
        self.disk_full = False  # the run stopped for want of space: nothing more is written
        self.bar: Any = None
        self.on_settled: Any = None  # told of each outcome and its ledger entry as it is written (the rollout service)
        self.on_committed: Any = None  # told once what was written is on disk (the rollout service answers then)
        # indices as the dataset is now (rows may have been removed or moved since a record was written)
        self.index_of = index_of_samples(dataset.ids, config.samples, state.done)
        store.note_fingerprint(self.fingerprint, state)
        record_keys(store.dir, keys_held(config, api_key))  # their prints: an export masks them wherever they show

    # --- checkpoint --------------------------------------------------------------------------

    def write_checkpoint(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_checkpoint < CHECKPOINT_EVERY:
            return
        self._last_checkpoint = now
        self.store.flush()
        self.store.write_checkpoint({
            "run_name": self.config.run_name,
            "config_fingerprint": self.fingerprint,
            "config": self.config.stored(),
            "dataset_path": os.path.abspath(str(self.config.dataset_file)),  # which dataset, wherever a resume starts
            "fingerprinted": self.fingerprinted,  # so a refused resume can say what changed, files read included
            # counts only: the ledger lists every settled prompt (ids here would be rewritten every few seconds)
            "completed": len(self.state.done),
            "discarded": len(self.state.discarded),
            "failed": len(self.state.failed),
            "ledger": LEDGER,
            "last_updated": now_iso(),
        })

    # --- preflight ---------------------------------------------------------------------------
    def preflight(self, items: list[WorkItem], problems: dict[str, str]) -> list[WorkItem]:
        """Endpoint reachable before any token is spent; the prompts whose image could not be had
        (`problems`, from `sandboxes_ready`) failed, saying why."""
        if items:
            asyncio.run(self.endpoint_ready())
        if not problems:
            return items
        runnable = []
        for item in items:
            why = problems.get(item.image or "")
            if why is None:
                runnable.append(item)
            else:
                self.settle(item, failure(item.id, item.index, item.attempt, "image_unavailable", why))
        self.store.flush()
        return runnable

    async def endpoint_ready(self) -> None:
        """The model endpoint reachable (an unreachable one is said, a rejected key refused)."""
        warning = await check_endpoint(self.config.model_settings(), self.api_key)
        if warning and self.config.verbose:
            say(warning)

    def close_out(self) -> None:
        """At the end of every invocation: sweep what crashed workers left, release run-wide resources."""
        try:
            asyncio.run(self._close_out())
        except Exception as exc:  # the trajectories are safe; only the cleanup failed
            say(f"warning: could not clean up the {self.config.backend} backend: {exc}")

    async def _close_out(self) -> None:
        async with backend_session(self.config) as backend:
            await backend.sweep_orphans()
            await backend.finish_run()

    # --- outcomes ----------------------------------------------------------------------------
    def settle(self, item: WorkItem, outcome: Outcome) -> None:
        """Write one prompt's outcome and count it (the executor's callback)."""
        if self.disk_full:
            return  # nothing more can be written: --resume runs it again
        pid, index = outcome.id, outcome.index
        self.tokens += outcome.tokens
        self.state.tokens += outcome.tokens
        self.state.cost += outcome.cost or 0.0
        if self.config.max_cost and outcome.tokens and outcome.cost is None and not self._said_no_cost:
            self._said_no_cost = True
            say(f"note: {self.config.base_url} reports no cost, so --max_cost cannot be enforced; "
                "--max_total_tokens can")
        entry = self.store.record(outcome, index // self.config.batch_size)
        if outcome.kind == "done":
            self.state.done[pid] = index
            self.state.failed.pop(pid, None)
            self._endpoint_outcome(False)
        elif outcome.kind == "discarded":
            self.state.discarded[pid] = outcome.reason or "discarded"
            self.state.failed.pop(pid, None)
            self._endpoint_outcome(False)
        else:
            self.state.failed[pid] = outcome.error_kind or ""
            if self.config.verbose or self.counts["failed"] < 5:
                say(f"prompt {index} (dataset line {self._line_of(pid)}) failed: {outcome.error_kind}: "
                    f"{str(outcome.error)[:300]}")
            self._failed_on_endpoint(item, outcome.error_kind)
        self.counts[outcome.kind] += 1
        self._uncommitted = True
        if self.bar is not None:
            self.bar.update(1)
        if self.on_settled is not None:
            self.on_settled(item, outcome, entry)

    def _line_of(self, pid: str) -> int | str:
        index = self.index_of.get(pid)
        return "?" if index is None else self.dataset.lines[index]

    def _failed_on_endpoint(self, item: WorkItem, kind: str | None) -> None:
        """An endpoint outage may hold the run back and bring the prompt back."""
        if kind in OUTAGE_KINDS:
            self._recent_outage_failures.append(item)
            self._endpoint_outcome(True)
        elif kind not in RUNNER_KINDS:
            self._endpoint_outcome(False)

    def _endpoint_outcome(self, failed: bool) -> None:
        message = self.breaker.outcome(failed, time.monotonic())
        if message:
            say(message)
        if failed and self.breaker.is_open:
            # what failed on the outage runs again in this invocation (it is in failed.jsonl too,
            # so a crash now still owes it to --resume); at most once more per failure
            while self._recent_outage_failures:
                self.requeue.append(self._recent_outage_failures.popleft().again())

    def over_budget(self) -> str | None:
        """Why the run may start no more prompts, or None: its spend across every invocation."""
        c, spent = self.config, self.state
        if c.max_total_tokens and spent.tokens >= c.max_total_tokens:
            return f"{spent.tokens} tokens spent, --max_total_tokens={c.max_total_tokens}"
        if c.max_cost and spent.cost >= c.max_cost:
            return f"${spent.cost:.4f} spent, --max_cost={c.max_cost:g}"
        return None

    # --- the dispatch loop -------------------------------------------------------------------
    def executor(self, prompts: int) -> Executor:
        context = {
            "config_fingerprint": self.fingerprint, "backend": self.config.backend,
            "distribution": None if self.config.toolsets else self.config.distribution,
            "run_name": self.config.run_name,
            **({"agent": self.config.harness_release} if self.config.harness_release else {}),
        }
        shares = self.config.worker_shares(prompts)
        if self.config.executor == "ray":
            from .ray_executor import RayExecutor  # Ray is an optional extra

            return RayExecutor(self.config, self.api_key, context, shares, self.settle, say)
        return ProcessPool(self.config, self.api_key, context, shares, self.settle, say)

    def dispatch(self, items: list[WorkItem], executor: Executor) -> None:
        """A batch run's prompts through `executor`, with a progress bar, until each has settled or the
        run stops (Ctrl-C, SIGTERM, a spent budget, a full disk: RunAborted, saying what --resume owes)."""
        pending = deque(items)
        executor.start()
        self.bar = tqdm(total=len(items), unit="prompt", dynamic_ncols=True, disable=None, file=sys.stderr,
                        desc=self.config.run_name)
        stop_reason: RunAborted | None = None
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            if over := self.drive(Planned(), executor, pending):
                stop_reason = RunAborted(f"budget reached ({over}); raise it to go on", EXIT_SOME_FAILED)
        except KeyboardInterrupt:
            stop_reason = RunAborted("interrupted", EXIT_INTERRUPTED)
        except RunAborted as exc:
            stop_reason = exc
        except OSError as exc:
            if not disk_full(exc):
                raise
            stop_reason = RunAborted(f"the disk holding {self.config.run_dir} is full: free space and rerun with --resume "
                                     "(nothing written before is lost)", EXIT_SOME_FAILED)
            self.disk_full = True
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
            executor.stop(STOP_GRACE)
            self.bar.close()
            with contextlib.suppress(OSError) if self.disk_full else contextlib.nullcontext():
                self.store.flush()
                self.write_checkpoint(force=True)
        if stop_reason is not None:
            owed = len(pending) + executor.in_flight()
            raise RunAborted(f"{stop_reason}; {owed} prompt(s) not finished will run with --resume", stop_reason.code)

    def drive(self, feed: Feed, executor: Executor, pending: deque[WorkItem]) -> str | None:
        """The dispatch loop, the one of a batch run and of the rollout service: starts what `pending`
        and `feed` hold while the executor has room (and the endpoint is up, the budget not spent),
        settles what comes back, commits it, watches for stuck prompts. Returns once the feed is
        closed and nothing is owed or in flight, or once it stops: why the budget held work back, or
        None. Raises RunAborted when nothing more can run (every worker died, the endpoint gone)."""
        over: str | None = None
        paused = False
        while True:
            feed.take(pending)
            if not over and (pending or not feed.closed) and (over := self.over_budget()):
                say(f"budget reached ({over}): no new {feed.noun} starts; the ones in flight finish")
            if over:
                feed.held_back(over, pending)
            while (pending and not over and executor.room() > 0
                   and (not self.breaker.is_open or self.breaker.allows(executor.in_flight(), time.monotonic()))):
                if not feed.start(pending, executor):
                    break
            self.progress(executor)
            executor.poll(feed.wait)
            if self._uncommitted and time.monotonic() - self._last_commit >= COMMIT_EVERY:
                self.commit()
            self.watchdog(executor)
            if self.requeue:
                if feed.retries:
                    pending.extendleft(reversed(self.requeue))
                    if self.bar is not None:
                        self.bar.total += len(self.requeue)
                self.requeue.clear()
            if paused != self.breaker.is_open and self.bar is not None:  # only when it changes: the loop turns often
                paused = self.breaker.is_open
                self.bar.set_description(f"{self.config.run_name} [paused: endpoint down]" if paused
                                         else self.config.run_name, refresh=False)
            if (pending or not feed.closed) and not executor.alive():
                raise RunAborted("every worker process died; see the messages above", EXIT_FATAL)
            if self.breaker.gave_up(time.monotonic()):
                raise RunAborted(f"the model endpoint {self.config.base_url} has been down for "
                                 f"{self.breaker.give_up / 60:.0f} minutes", EXIT_FATAL)
            self.write_checkpoint()
            if feed.stopped or (feed.closed and not (pending and not over) and not executor.in_flight()):
                return over

    def progress(self, executor: Executor) -> None:
        """A line of progress every PROGRESS_EVERY seconds where the bar is not drawn (a log file, a pipe)."""
        now = time.monotonic()
        if self.bar is None or not self.bar.disable or now - self._last_progress < PROGRESS_EVERY:
            return
        self._last_progress = now
        c, elapsed = self.counts, max(1e-6, now - self.started)
        say(f"{self.config.run_name}: {c['done'] + c['discarded'] + c['failed']}/{self.bar.total} prompts settled "
            f"({c['done']} done, {c['discarded']} discarded, {c['failed']} failed), {executor.in_flight()} in flight; "
            f"{elapsed:.0f} s, {self.tokens / elapsed:.0f} tok/s")

    def commit(self) -> None:
        """Make what was just recorded durable in one fsync, show it, and tell `on_committed`."""
        self.store.flush()
        self._uncommitted, self._last_commit = False, time.monotonic()
        if self.bar is not None:
            elapsed = max(1e-6, time.monotonic() - self.started)
            self.bar.set_postfix(ok=self.counts["done"], discarded=self.counts["discarded"],
                                 failed=self.counts["failed"], tok_s=f"{self.tokens / elapsed:.0f}", refresh=False)
        if self.on_committed is not None:
            self.on_committed()

    def watchdog(self, executor: Executor) -> None:
        """A prompt far past --prompt_timeout has a stuck worker (a blocked thread, a stopped
        process): record it as failed, so the run does not wait for it forever."""
        now = time.monotonic()
        if now - self._last_watch < 1.0:  # the loop turns many times a second; ages move slower
            return
        self._last_watch = now
        def limit(item: WorkItem) -> float:
            most = time_budget(self.config, item)
            return most + max(WATCHDOG_GRACE, most / 4)

        late = executor.overdue(limit)
        for item, where in late:
            self.settle(item, failure(item.id, item.index, item.attempt, "watchdog",
                                      f"no result from {where} more than {limit(item):.0f} s after it started, past "
                                      f"its time limits (--prompt_timeout={self.config.prompt_timeout:g} s, and "
                                      "its setup's and checks' --check_timeout)"))
        if late:
            self.store.flush()

    # --- the end -----------------------------------------------------------------------------
    def finish(self, aborted: RunAborted | None) -> RunResult:
        if self.disk_full:  # the merge and the statistics wait for --resume, with space to write them
            return RunResult(self.config, self.counts, Statistics(), -1, -1, self.store.trajectories_path,
                             self.store.statistics_path, aborted, merged=False)
        merged, stats = self.store.merge(self.state, self.index_of)
        for where in self.store.unreadable[:5]:
            say(f"warning: a record the ledger names is not a record (changed by hand?): {where}; left out of "
                "trajectories.jsonl")
        total = len(self.dataset)
        outstanding = [sid for _, _, sid in each_sample(self.dataset.ids, self.config.samples)
                       if not self.state.settled(sid)]
        failed_now = [pid for pid in outstanding if pid in self.state.failed]
        discard_reasons = Counter(self.state.discarded.values())
        self.store.write_statistics({
            "run_name": self.config.run_name,
            "model": self.config.model_label,
            "distribution": None if self.config.toolsets else self.config.distribution,
            "toolsets": self.config.toolsets,
            "backend": self.config.backend,
            "config_fingerprint": self.fingerprint,
            "total_prompts": total,
            "samples_per_prompt": self.config.samples,
            "batch_size": self.config.batch_size,
            "total_batches": -(-total // self.config.batch_size),
            "merged_trajectories": merged,
            "discarded": sum(discard_reasons.values()),
            "discarded_by_reason": dict(discard_reasons),
            "discarded_no_reasoning": discard_reasons.get("no_reasoning", 0),
            "failed_outstanding": len(failed_now),
            "not_yet_run": len(outstanding) - len(failed_now),
            "dataset_rows_rejected": len(self.dataset.problems),
            "toolsets_left_out": sorted(self.config.toolsets_left_out),  # drawn, not offered: what they lack was said
            "completed_at": now_iso(),
            "duration_seconds": round(time.monotonic() - self.started, 2),
            **stats.to_json(),
        })
        return RunResult(self.config, self.counts, stats, len(outstanding), len(failed_now),
                         self.store.trajectories_path, self.store.statistics_path, aborted)


async def sandboxes_ready(config: RunConfig, images: dict[str, str | None]) -> dict[str, str]:
    """The backend up (one that cannot work is refused here), leftovers of a killed run swept, these
    images present (image → the directory whose Dockerfile builds it, or None); those that could
    not be had, with why (each said once). Needs no model: it runs before one starts."""
    async with backend_session(config) as backend:
        for note in backend.notes:
            say(note)
        swept = await backend.sweep_orphans()
        if swept:
            say(f"removed {swept} sandbox(es) left behind by an earlier run of {config.run_name!r}")
        problems = await prepare_images(backend, images)
    for image, why in problems.items():
        say(f"image {image or config.sandbox.image!r} is unavailable: {why}")
    return problems


async def prepare_images(backend: Backend, wanted: dict[str, str | None]) -> dict[str, str]:
    """Every image present (pulled, or built once from its directory's Dockerfile), a few at a
    time; why each that is not could not be had ("" is the backend's default image)."""
    gate = asyncio.Semaphore(4)
    problems: dict[str, str] = {}

    async def check(image: str, build: str | None) -> None:
        async with gate:
            try:
                if build and image and await backend.build_image(build, image):
                    say(f"built image {image} from {build}/Dockerfile")
                await backend.prepare_image(image or None)
            except (ImageUnavailable, SandboxError) as exc:
                problems[image] = str(exc)

    await asyncio.gather(*(check(image, build) for image, build in sorted(wanted.items())))
    return problems


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
