"""The parent process: plans the run, feeds workers one prompt at a time, and writes every file.

Exit codes: 0 every prompt settled; 3 some prompts failed (rerun with --resume); 1 a fatal error
(bad configuration, rejected key, dead endpoint); 130 interrupted.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm import tqdm

import distributions
from backends import Backend, ImageUnavailable, SandboxError, load_backend

from .config import RunConfig, backend_settings, fingerprint
from .dataset import Dataset, PromptRecord
from .limits import OutageBreaker
from .llm import check_endpoint
from .sampling import sample_toolsets
from .stats import Statistics
from .store import CHECKPOINT, DISCARDED, FAILED, STATISTICS, RunState, RunStore, now_iso
from .tools import TOOLSETS, schema_hash
from .worker import WorkItem, failure, worker_main

EXIT_OK, EXIT_FATAL, EXIT_SOME_FAILED, EXIT_INTERRUPTED = 0, 1, 3, 130
CHECKPOINT_EVERY = 2.0  # seconds; the batch files are the truth, the checkpoint a summary
STOP_GRACE = 30.0  # seconds workers get to close their sandboxes when the run stops
WATCHDOG_GRACE = 10.0  # seconds past --prompt_timeout (at least; a quarter of it for long limits)
# failures that say the endpoint is down, not that the prompt is bad
OUTAGE_KINDS = {"endpoint_unreachable", "timeout", "server_error", "rate_limited"}


class RunAborted(RuntimeError):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def say(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


@dataclass
class WorkerHandle:
    number: int
    process: Any
    tasks: Any
    capacity: int
    sandboxes: int
    in_flight: dict[str, WorkItem] = field(default_factory=dict)
    sent_at: dict[str, float] = field(default_factory=dict)  # id → when it was handed over
    exited: bool = False


@dataclass
class Plan:
    items: list[WorkItem]
    skipped_done: int
    skipped_discarded: int
    retried: int
    gave_up: int = 0  # failed --max_attempts times: not retried


def plan_work(config: RunConfig, dataset: Dataset, state: RunState) -> Plan:
    dist = None if config.toolsets else distributions.get(config.distribution, set(TOOLSETS))
    items, done, discarded, retried, gave_up = [], 0, 0, 0, 0
    for rec in dataset.records:
        if rec.id in state.done:
            done += 1
            continue
        if rec.id in state.discarded:
            discarded += 1
            continue
        if rec.id in state.failed and state.attempts.get(rec.id, 0) >= config.max_attempts:
            gave_up += 1  # it would most likely fail again and spend again
            continue
        retried += rec.id in state.failed
        items.append(_item(config, rec, dist, state.attempts.get(rec.id, 0) + 1))
    return Plan(items, done, discarded, retried, gave_up)


def _item(config: RunConfig, rec: PromptRecord, dist, attempt: int) -> WorkItem:
    toolsets = list(config.toolsets) if config.toolsets else sample_toolsets(rec.id, dist)
    return WorkItem(
        id=rec.id, index=rec.index, prompt=rec.prompt, toolsets=toolsets,
        batch_num=rec.index // config.batch_size, image=rec.image, cwd=rec.cwd,
        extra=rec.extra, attempt=attempt,
    )


class Runner:
    def __init__(self, config: RunConfig, dataset: Dataset, store: RunStore, state: RunState, api_key: str | None):
        self.config = config
        self.dataset = dataset
        self.store = store
        self.state = state
        self.api_key = api_key
        self.fingerprint = fingerprint(config.fingerprint_fields(schema_hash()))
        self.counts = Counter()
        self.tokens = 0
        self.started = time.monotonic()
        self.breaker = OutageBreaker(max(5, min(20, config.concurrency)))
        self.requeue: list[WorkItem] = []  # prompts the endpoint failed while it was down: run again
        self._recent_outage_failures: deque[WorkItem] = deque(maxlen=64)
        self._said_no_cost = False
        self._last_watch = 0.0
        self._last_checkpoint = 0.0
        self.batch_stats: dict[int, Counter] = {}
        # indices as the dataset is now (rows may have been removed or moved since a record was written)
        self.index_of = {r.id: r.index for r in dataset.records}
        self.state.done = {pid: self.index_of.get(pid, -1) for pid in self.state.done}
        self._rebuild_batch_stats()
        self.lines = {r.id: r.line for r in dataset.records}  # for messages that name a dataset line

    # --- checkpoint --------------------------------------------------------------------------
    def _rebuild_batch_stats(self) -> None:
        size = self.config.batch_size
        for index in self.state.done.values():
            if index >= 0:  # rows no longer in the dataset belong to no batch of it
                self.batch_stats.setdefault(index // size, Counter())["processed"] += 1
        by_id = self.index_of
        for pid in self.state.discarded:
            if pid in by_id:
                self.batch_stats.setdefault(by_id[pid] // size, Counter())["discarded"] += 1
        for pid in self.state.failed:
            if pid in by_id:
                self.batch_stats.setdefault(by_id[pid] // size, Counter())["failed"] += 1

    def write_checkpoint(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_checkpoint < CHECKPOINT_EVERY:
            return
        self._last_checkpoint = now
        self.store.flush()
        self.store.write_json(CHECKPOINT, {
            "run_name": self.config.run_name,
            "config_fingerprint": self.fingerprint,
            "config": self.config.stored(),
            "completed_prompts": sorted({i for i in self.state.done.values() if i >= 0}),
            "completed_ids": sorted(self.state.done),
            "discarded_ids": sorted(self.state.discarded),
            "failed_ids": sorted(self.state.failed),
            "batch_stats": {str(k): dict(v) for k, v in sorted(self.batch_stats.items())},
            "last_updated": now_iso(),
        })

    # --- preflight ---------------------------------------------------------------------------
    def preflight(self, items: list[WorkItem]) -> list[WorkItem]:
        """Endpoint reachable, backend up, leftovers swept, every image present: before any token is spent."""
        return asyncio.run(self._preflight(items))

    async def _preflight(self, items: list[WorkItem]) -> list[WorkItem]:
        if items:
            warning = await check_endpoint(self.config, self.api_key)
            if warning and self.config.verbose:
                say(warning)
        backend = load_backend(self.config.backend, backend_settings(self.config))
        try:
            await backend.setup()
            swept = await backend.sweep_orphans()
            if swept:
                say(f"removed {swept} sandbox(es) left behind by an earlier run of {self.config.run_name!r}")
            return await self._check_images(backend, items)
        finally:
            await backend.shutdown()

    def close_out(self) -> None:
        """At the end of every invocation: sweep what crashed workers left, release run-wide resources."""
        try:
            asyncio.run(self._close_out())
        except Exception as exc:  # the trajectories are safe; only the cleanup failed
            say(f"warning: could not clean up the {self.config.backend} backend: {exc}")

    async def _close_out(self) -> None:
        backend = load_backend(self.config.backend, backend_settings(self.config))
        await backend.setup()
        try:
            await backend.sweep_orphans()
            await backend.finish_run()
        finally:
            await backend.shutdown()

    async def _check_images(self, backend: Backend, items: list[WorkItem]) -> list[WorkItem]:
        images = sorted({i.image or "" for i in items})
        gate = asyncio.Semaphore(4)
        problems: dict[str, str] = {}

        async def check(image: str) -> None:
            async with gate:
                try:
                    await backend.prepare_image(image or None)
                except (ImageUnavailable, SandboxError) as exc:
                    problems[image] = str(exc)

        await asyncio.gather(*(check(img) for img in images))
        if not problems:
            return items
        runnable = []
        for item in items:
            why = problems.get(item.image or "")
            if why is None:
                runnable.append(item)
            else:
                self.record_failure(item, "image_unavailable", why)
        for image, why in problems.items():
            say(f"image {image or self.config.image!r} is unavailable: {why}")
        self.store.flush()
        return runnable

    # --- outcomes ----------------------------------------------------------------------------
    def record_failure(self, item: WorkItem, kind: str, message: str) -> None:
        self.handle("failed", *failure(item, kind, message))

    def handle(self, kind: str, summary: dict[str, Any], line: bytes) -> None:
        pid, index = summary["id"], summary["index"]
        batch = self.batch_stats.setdefault(index // self.config.batch_size, Counter())
        self.tokens += summary.get("tokens") or 0
        self.state.tokens += summary.get("tokens") or 0
        self.state.cost += summary.get("cost") or 0.0
        if self.config.max_cost and summary.get("tokens") and summary.get("cost") is None and not self._said_no_cost:
            self._said_no_cost = True
            say(f"note: {self.config.base_url} reports no cost, so --max_cost cannot be enforced; "
                "--max_total_tokens can")
        if kind == "done":
            self.store.append(f"batch_{index // self.config.batch_size}.jsonl", line)
            self.state.done[pid] = index
            self.state.failed.pop(pid, None)
            batch["processed"] += 1
            self._endpoint_outcome(False)
        elif kind == "discarded":
            self.store.append(DISCARDED, line)
            self.state.discarded[pid] = summary.get("reason", "discarded")
            self.state.failed.pop(pid, None)
            batch["discarded"] += 1
            self._endpoint_outcome(False)
        else:
            self.store.append(FAILED, line)
            self.state.failed[pid] = summary
            batch["failed"] += 1
            if self.config.verbose or self.counts["failed"] < 5:
                say(f"prompt {index} (dataset line {self._line(pid)}) failed: {summary.get('kind')}: {str(summary.get('error'))[:300]}")
        self.counts[kind] += 1

    def _line(self, pid: str) -> str:
        return str(self.lines.get(pid, "?"))

    # --- the dispatch loop -------------------------------------------------------------------
    def dispatch(self, items: list[WorkItem]) -> int:
        if not items:
            return EXIT_OK
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        pending = deque(items)
        context = {
            "config_fingerprint": self.fingerprint, "backend": self.config.backend,
            "distribution": None if self.config.toolsets else self.config.distribution,
            "run_name": self.config.run_name,
        }
        stored = self.config.model_dump(mode="json", exclude={"api_key"})
        shares = self.config.worker_shares(len(items))
        n_workers = len(shares)
        workers: dict[int, WorkerHandle] = {}
        restarts = 0

        def spawn(number: int, loops: int, sandboxes: int) -> None:
            tasks = ctx.Queue()
            proc = ctx.Process(target=worker_main, name=f"hermes-batch-worker-{number}", daemon=True,
                               args=(number, stored, self.api_key, tasks, results, context, loops, sandboxes))
            proc.start()
            workers[number] = WorkerHandle(number, proc, tasks, loops, sandboxes)

        for n, (loops, sandboxes) in enumerate(shares):
            spawn(n, loops, sandboxes)
        bar = tqdm(total=len(items), unit="prompt", dynamic_ncols=True, disable=None, file=sys.stderr,
                   desc=self.config.run_name)
        stop_reason: RunAborted | None = None
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            over, paused = None, False
            while (pending and not over) or any(w.in_flight for w in workers.values()):
                if pending and not over and (over := self.over_budget()):
                    say(f"budget reached ({over}): no new prompt starts; the ones in flight finish")
                for w in workers.values():
                    while (pending and not over and not w.exited and len(w.in_flight) < w.capacity
                           and (not self.breaker.is_open or self.breaker.allows(
                               sum(len(x.in_flight) for x in workers.values()), time.monotonic()))):
                        item = pending.popleft()
                        w.in_flight[item.id] = item
                        w.sent_at[item.id] = time.monotonic()
                        w.tasks.put(("run", asdict(item)))
                self._drain(results, workers, bar)
                for w in list(workers.values()):
                    if not w.exited and not w.process.is_alive():
                        w.exited = True
                        lost = list(w.in_flight.values())
                        w.in_flight.clear()
                        for item in lost:
                            self.record_failure(item, "worker_died",
                                                f"worker process {w.number} died (exit code {w.process.exitcode})")
                        bar.update(len(lost))
                        if restarts < 3 * n_workers and pending:
                            restarts += 1
                            spawn(max(workers) + 1, w.capacity, w.sandboxes)  # takes over the dead one's share
                self._watchdog(workers, bar)
                if self.requeue:
                    pending.extendleft(reversed(self.requeue))
                    bar.total += len(self.requeue)
                    self.requeue.clear()
                if paused != self.breaker.is_open:  # only when it changes: the loop turns often
                    paused = self.breaker.is_open
                    bar.set_description(f"{self.config.run_name} [paused: endpoint down]" if paused
                                        else self.config.run_name, refresh=False)
                if not any(not w.exited for w in workers.values()) and pending:
                    raise RunAborted("every worker process died; see the messages above", EXIT_FATAL)
                if self.breaker.gave_up(time.monotonic()):
                    raise RunAborted(f"the model endpoint {self.config.base_url} has been down for "
                                     f"{self.breaker.give_up / 60:.0f} minutes", EXIT_FATAL)
                self.write_checkpoint()
            if over:
                stop_reason = RunAborted(f"budget reached ({over}); raise it to go on", EXIT_SOME_FAILED)
        except KeyboardInterrupt:
            stop_reason = RunAborted("interrupted", EXIT_INTERRUPTED)
        except RunAborted as exc:
            stop_reason = exc
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
            self._stop_workers(workers, results, bar)
            bar.close()
            self.store.flush()
            self.write_checkpoint(force=True)
        if stop_reason is not None:
            owed = len(pending) + sum(len(w.in_flight) for w in workers.values())
            raise RunAborted(f"{stop_reason}; {owed} prompt(s) not finished will run with --resume", stop_reason.code)
        return EXIT_OK

    def failed_item(self, item: WorkItem, kind: str) -> None:
        """After a failure is recorded: an endpoint outage may hold the run back and bring the prompt back."""
        if kind in OUTAGE_KINDS:
            self._recent_outage_failures.append(item)
            self._endpoint_outcome(True)
        else:
            self._endpoint_outcome(False)

    def _endpoint_outcome(self, failed: bool) -> None:
        message = self.breaker.outcome(failed, time.monotonic())
        if message:
            say(message)
        if failed and self.breaker.is_open:
            # what failed on the outage runs again in this invocation (it is in failed.jsonl too,
            # so a crash now still owes it to --resume); at most once more per failure
            while self._recent_outage_failures:
                item = self._recent_outage_failures.popleft()
                self.requeue.append(WorkItem(**{**asdict(item), "attempt": item.attempt + 1}))

    def over_budget(self) -> str | None:
        """Why the run may start no more prompts, or None: its spend across every invocation."""
        c, spent = self.config, self.state
        if c.max_total_tokens and spent.tokens >= c.max_total_tokens:
            return f"{spent.tokens} tokens spent, --max_total_tokens={c.max_total_tokens}"
        if c.max_cost and spent.cost >= c.max_cost:
            return f"${spent.cost:.4f} spent, --max_cost={c.max_cost:g}"
        return None

    def _watchdog(self, workers: dict[int, WorkerHandle], bar) -> None:
        """A prompt far past --prompt_timeout has a stuck worker (a blocked thread, a stopped
        process): record it as failed, so the run does not wait for it forever."""
        limit = self.config.prompt_timeout + max(WATCHDOG_GRACE, self.config.prompt_timeout / 4)
        now = time.monotonic()
        if now - self._last_watch < 1.0:  # the loop turns many times a second; ages move slower
            return
        self._last_watch = now
        for w in workers.values():
            for pid, age in [(p, now - t) for p, t in w.sent_at.items() if now - t > limit]:
                w.sent_at.pop(pid)
                item = w.in_flight.pop(pid, None)
                if item is not None:  # a result that comes later is ignored: this one is settled
                    self.record_failure(item, "watchdog", f"no result from worker {w.number} {age:.0f} s after it "
                                        f"started, past --prompt_timeout={self.config.prompt_timeout:g} s")
                    bar.update(1)

    def _drain(self, results, workers: dict[int, WorkerHandle], bar) -> None:
        """Handle every message that is waiting (at least one, or 0.2 s), then commit them in one fsync."""
        try:
            msg = results.get(timeout=0.2)
        except queue.Empty:
            return
        handled = 0
        while True:
            kind, number = msg[0], msg[1]
            w = workers.get(number)
            if kind in ("done", "discarded", "failed"):
                summary, line = msg[2], msg[3]
                item = w.in_flight.pop(summary["id"], None) if w is not None else None
                if item is not None:
                    w.sent_at.pop(summary["id"], None)
                    self.handle(kind, summary, line)
                    if kind == "failed":
                        self.failed_item(item, summary.get("kind"))
                    bar.update(1)
                    handled += 1
            elif kind == "fatal":
                raise RunAborted(msg[2], EXIT_FATAL)
            elif kind == "exited" and w is not None:
                w.exited = True
            if handled >= 512:
                break
            try:
                msg = results.get_nowait()
            except queue.Empty:
                break
        if handled:
            self.store.flush()
            elapsed = max(1e-6, time.monotonic() - self.started)
            bar.set_postfix(ok=self.counts["done"], discarded=self.counts["discarded"], failed=self.counts["failed"],
                            tok_s=f"{self.tokens / elapsed:.0f}", refresh=False)

    def _stop_workers(self, workers: dict[int, WorkerHandle], results, bar) -> None:
        for w in workers.values():
            if not w.exited:
                try:
                    w.tasks.put(("stop", None))
                except (ValueError, OSError):
                    pass
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(not w.exited and w.process.is_alive() for w in workers.values()):
            try:
                msg = results.get(timeout=0.2)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                break  # a second Ctrl-C: stop waiting
            kind, number = msg[0], msg[1]
            w = workers.get(number)
            if kind in ("done", "discarded", "failed") and w is not None and w.in_flight.pop(msg[2]["id"], None):
                self.handle(kind, msg[2], msg[3])  # finished while stopping: keep it
                bar.update(1)
            elif kind == "exited" and w is not None:
                w.exited = True
        for w in workers.values():
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=2)

    # --- the end -----------------------------------------------------------------------------
    def finish(self) -> Statistics:
        stats = Statistics()
        merged = self.store.merge(on_record=stats.add, index_of=self.index_of)
        total = len(self.dataset.records)
        in_dataset = {r.id for r in self.dataset.records}
        outstanding = [pid for pid in in_dataset if not self.state.settled(pid)]
        failed_now = [pid for pid in outstanding if pid in self.state.failed]
        discard_reasons = Counter(self.state.discarded.values())
        self.store.write_json(STATISTICS, {
            "run_name": self.config.run_name,
            "model": self.config.model_label,
            "distribution": None if self.config.toolsets else self.config.distribution,
            "toolsets": self.config.toolsets,
            "backend": self.config.backend,
            "config_fingerprint": self.fingerprint,
            "total_prompts": total,
            "batch_size": self.config.batch_size,
            "total_batches": -(-total // self.config.batch_size),
            "merged_trajectories": merged,
            "discarded": sum(discard_reasons.values()),
            "discarded_by_reason": dict(discard_reasons),
            "discarded_no_reasoning": discard_reasons.get("no_reasoning", 0),
            "failed_outstanding": len(failed_now),
            "not_yet_run": len(outstanding) - len(failed_now),
            "dataset_rows_rejected": len(self.dataset.problems),
            "completed_at": now_iso(),
            "duration_seconds": round(time.monotonic() - self.started, 2),
            **stats.to_json(),
        })
        self.outstanding = len(outstanding)
        self.failed_outstanding = len(failed_now)
        return stats


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
