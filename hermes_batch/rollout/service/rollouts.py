"""The rollout service: one long-lived process that takes rollout requests (over HTTP, http_api.py,
or in the trainer's own process) and runs each through the same sandbox → agent → check → record as
a batch run, its worker processes, sandbox backend and embedded model kept warm from one request to
the next.

A request names a task of the service's dataset (its prompt id, or its prompt), and may name the
served model to ask (a trainer's policy version, e.g. a LoRA adapter `{name}-v{N}`) and that
version's number, and on the embedded model the weights file (in the run's `policy/`) that
serves it; else the policy the trainer last set (`set_policy`) serves it. Every record carries
them. New weights are loaded once every rollout on the old ones has settled: no rollout is served
by two. Once settled, its answer is the rollout's model calls as token ids with their
log-probabilities (token-exact by default), its check's reward (None where nothing decided it) and
its verdict.

Nothing acknowledged is lost or run twice: a request is written to `requests.jsonl` (fsynced)
before it is acknowledged, its outcome to the run's batch files and ledger by the single writer
(the spine's dispatch loop on this service's thread, the only one that touches the run's store) before it is told. Started again
on the same run after a crash (`kill -9`), the service runs every acknowledged request that has no
outcome and answers the others from what it wrote; asked again for a rollout id it knows, it answers
with that rollout. A failed rollout stays failed: the trainer asks again under a new id."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ... import distributions
from ...config import ConfigError, RunConfig, check_fingerprint, configure
from ...dataset import PromptRecord, read_source
from ...episode import WorkItem, opening
from ...errors import RunAborted
from ...llm.local_model import LocalModelError, LocalModelServer, embedded_server
from ...llm.token_client import sampling_temperature
from ...record import Outcome, failure, messages, now_iso, side_token_calls
from ...runner import STOP_GRACE, Executor, Spine, check_tools, sandboxes_ready, warm_up, work_item
from ...store import LedgerEntry, RunState, RunStore
from ...tokens import TokenTrace, refusal
from ...util import atomic_write, say
from .wire import (
    Policy,
    RequestRefused,
    RolloutRequest,
    RolloutResult,
    RolloutTurn,
    ServiceInfo,
    TaskEntry,
    TaskList,
)

REQUESTS = "requests.jsonl"  # every acknowledged request, in order: what a restarted service still owes
POLICY = "policy.json"  # the policy the trainer last set
MAX_WAIT = 60.0  # seconds one wait for a rollout may last (a long poll over HTTP)
RECENT = 1024  # settled rollouts kept whole in memory; older ones are read again from the run when asked


class RolloutService:
    """Runs rollout requests as they come, in the run `data/<run_name>/` (see the module's doc).

    `flags`: the run's usual flags (`model`, `backend`, `toolsets`, `concurrency`, …); `tokens`
    is `exact` unless given. `max_queued`: requests waiting beyond those in flight before the
    service refuses more (HTTP 429). `start()` then `serve_forever()` (or `start(background=True)`
    in a trainer's process, as `with RolloutService(...) as service:` does), `stop()` at the end."""

    def __init__(self, dataset_file: str | Path, *, run_name: str, output_dir: str | Path = "data",
                 max_queued: int | None = None, **flags: Any) -> None:
        given = {"require_reasoning": False, "tokens": "exact", **flags, "dataset_file": str(dataset_file),
                 "run_name": run_name, "output_dir": str(output_dir), "resume": True}
        self.config: RunConfig = configure(given)
        if self.config.samples > 1:
            raise ConfigError("--samples: a rollout is one sample; ask the service for as many rollouts as you want "
                              "samples (each draws its own)")
        self.max_queued = max_queued if max_queued is not None else 4 * self.config.concurrency
        self.run_dir = self.config.run_dir
        self.policy_dir = self.run_dir / "policy"  # the embedded model's weights a trainer wrote, by version
        self.model_server: LocalModelServer | None = None  # the embedded model's, whose weights it swaps
        self._loaded: tuple[str | None, tuple[int, ...]] = (None, ())  # the weights file it serves, as it was then
        self._lock = threading.Condition()  # guards what callers and the loop share (below)
        self._intake: queue.Queue[WorkItem] = queue.Queue()
        self._requests: dict[str, RolloutRequest] = {}  # every acknowledged request, its model and version resolved
        self._live: dict[str, RolloutResult] = {}  # queued or running
        self._where: dict[str, LedgerEntry] = {}  # done: where its record is
        self._failed: dict[str, RolloutResult] = {}  # failed or discarded
        self._recent: OrderedDict[str, RolloutResult] = OrderedDict()  # done, whole, the most recent
        self._cancelled: set[str] = set()
        self._policy = Policy()
        self._over: str | None = None  # why no new rollout may start (a budget), once reached
        self._announce: list[tuple[WorkItem, Outcome, LedgerEntry]] = []  # the loop's: settled, told once fsynced
        self._stopping = threading.Event()
        self._listeners: list[Callable[[], None]] = []  # told when rollouts settle and when the loop ends
        self._thread: threading.Thread | None = None
        self._stack = contextlib.ExitStack()
        self.started = False
        self.failure: str | None = None  # why the loop ended on its own (the service then stops, and says why)

    # --- start and stop ------------------------------------------------------------------------
    def start(self, background: bool = False) -> None:
        config = self.config
        check_tools(config)
        if config.executor == "local":
            warm_up()
        self.dataset = read_source(config.dataset_file or "", config.run_dir)
        records = self.dataset.records
        if not records:
            raise ConfigError(f"{self.dataset.path} has no usable rows ({len(self.dataset.problems)} rejected)")
        self.by_id: dict[str, PromptRecord] = {r.id: r for r in records}
        prompts = Counter(r.prompt for r in records)
        self.by_prompt = {r.prompt: r.id for r in records if prompts[r.prompt] == 1}
        self.store = RunStore(config.run_dir)
        self.store.lock()
        self._stack.callback(self.store.close)
        try:
            self._open(records)
        except BaseException:
            self._stack.close()
            raise
        self.started = True
        if background:
            self._thread = threading.Thread(target=self._serve, name="rollout-service", daemon=True)
            self._thread.start()

    def _open(self, records: list[PromptRecord]) -> None:
        config = self.config
        self.state = self.store.scan()
        if self.store.has_outputs() and not config.allow_config_change:
            check_fingerprint(config, self.store.read_checkpoint(), self.state.fingerprints)
        # every task's image now, before a model starts: a request for one that cannot be had fails at once, saying why
        self.unavailable = asyncio.run(sandboxes_ready(config, {r.sandbox_image or "": r.task.environment if r.task
                                                                else None for r in records}))
        if config.uses_local_model:
            common = Counter(tuple(self._item_for(r).toolsets) for r in records)
            self.model_server = self._stack.enter_context(embedded_server(
                config.local_model, threads=config.local_threads, ctx=config.local_ctx,
                parallel=config.local_parallel, log_path=self.store.local_model_log, say=say,
                opening=None if config.harness else opening(config, list(common.most_common(1)[0][0])),
                exact_cache=config.tokens == "exact"))
            self.starting_weights = self.model_server.model_file
            self.policy_dir.mkdir(exist_ok=True)
            self.config = config = config.model_copy(update={"base_url": self.model_server.url})
        self.spine = Spine(config, self.dataset, self.store, self.state, config.resolved_api_key())
        self.spine.index_of = {}  # each rollout at its task's row: the merged file groups a task's rollouts
        self.spine.on_settled = self._settled_one
        self.spine.on_committed = self._tell_settled
        asyncio.run(self.spine.endpoint_ready())
        self.spine.write_checkpoint(force=True)
        with contextlib.suppress(FileNotFoundError, ValidationError):
            self._policy = Policy.model_validate_json((self.run_dir / POLICY).read_bytes())
        self._replay()
        self.executor = self.spine.executor(config.concurrency)
        self.executor.start()
        self._stack.callback(self.executor.stop, STOP_GRACE)
        say(f"serving {len(self.by_id)} tasks of {self.dataset.path}: model {config.model_label}, backend "
            f"{config.backend}, {config.concurrency} rollouts in flight, tokens {config.tokens}; run {self.run_dir}")

    def _replay(self) -> None:
        """The requests of an earlier life of this run: those with an outcome are answered from the
        run, the others run again. A torn last line (a write cut short) was never acknowledged: it
        is cut off, so the next request is not written after it."""
        path = self.run_dir / REQUESTS
        if not path.exists():
            return
        data = path.read_bytes()
        if not data.endswith(b"\n") and data:
            os.truncate(path, data.rfind(b"\n") + 1)
            data = data[:data.rfind(b"\n") + 1]
        outcomes = {e.id: e for _, e in self.store.ledger_entries()}  # the last outcome of each
        owed = 0
        for n, line in enumerate(data.split(b"\n")[:-1], 1):
            try:
                req = RolloutRequest.model_validate_json(line)
            except ValidationError:
                say(f"warning: {path}:{n} is not a request (changed by hand?); left out")
                continue
            if req.rollout_id in self._requests:
                continue  # acknowledged once; a second line of it cannot be written, but is never run twice
            self._requests[req.rollout_id] = req
            entry = outcomes.get(req.rollout_id)
            try:
                item = self._item(req)
            except RequestRefused as exc:  # the dataset was edited since: settled as failed, saying why
                if entry is not None:
                    self._known_outcome(req, entry)
                else:
                    gone = WorkItem(id=req.rollout_id, index=0, prompt="", toolsets=[], batch_num=0)
                    self.spine.settle(gone, failure(gone.id, 0, 1, "task_gone", str(exc)))
                continue
            self.spine.index_of[req.rollout_id] = item.index  # its record's place in the merged file
            if entry is not None:
                self._known_outcome(req, entry)
                continue
            self._intake.put(item)
            self._live[req.rollout_id] = self._pending(req, item)
            owed += 1
        self.spine.commit()
        if self._requests:
            say(f"{len(self._requests)} requests of an earlier start: {len(self._requests) - owed} settled, "
                f"{owed} run again")

    def _known_outcome(self, req: RolloutRequest, entry: LedgerEntry) -> None:
        if entry.kind == "d":
            self._where[req.rollout_id] = entry
        else:
            self._failed[req.rollout_id] = RolloutResult(
                rollout_id=req.rollout_id, state="discarded" if entry.kind == "x" else "failed",
                model=_served_model(req) or self.config.model_label,
                policy_version=req.policy_version or 0, error=entry.note or None)

    def serve_forever(self) -> None:
        """The single writer's loop, until `stop()` (or Ctrl-C, SIGTERM in the main thread)."""
        self._serve()

    def stop(self) -> None:
        """Stops taking work and stops what is in flight (it runs again when the service starts
        again), writes the merged trajectories and statistics, and releases the workers,
        sandboxes and model."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if not self.started:
            return
        self.started = False
        try:
            self.executor.stop(STOP_GRACE)
            self.spine.commit()
            self._write_statistics()
            self.spine.close_out()
        finally:
            self._stack.close()

    def __enter__(self) -> RolloutService:
        if not self.started:
            self.start(background=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- requests (any thread) -----------------------------------------------------------------
    def submit(self, req: RolloutRequest) -> RolloutResult:
        """Takes a rollout, durably before it returns; the same id again answers with that rollout."""
        with self._lock:
            if not self.started or self._stopping.is_set():
                raise RequestRefused("the service is stopping", 503)
            known = self._requests.get(req.rollout_id)
            if known is not None:  # asked again (a retry): the fields it gives must be the ones it had
                same_task = req.task == known.task or self._task(req.task).id == known.task
                given = [(req.model, known.model), (req.policy_version, known.policy_version), (req.seed, known.seed),
                         (req.weights, known.weights)]
                if not same_task or any(new is not None and new != old for new, old in given):
                    raise RequestRefused(f"rollout {req.rollout_id!r} was asked before with another task, model, "
                                         "policy version, seed or weights", 409)
                return self._result(req.rollout_id)
            # kept with its task's prompt id (an unknown task is refused here, before it is written), and
            # the policy of now where it names none
            req = req.model_copy(update={
                "task": self._task(req.task).id, "model": req.model if req.model is not None else self._policy.model,
                "policy_version": req.policy_version if req.policy_version is not None else self._policy.version,
                "weights": self._weights(req.weights) if req.weights is not None else self._policy.weights})
            item = self._item(req)
            if self._over:
                raise RequestRefused(f"the run's budget is spent ({self._over}): no new rollout starts", 503)
            if sum(r.state == "queued" and rid not in self._cancelled for rid, r in self._live.items()) >= self.max_queued:
                raise RequestRefused(f"{self.max_queued} requests are waiting already; ask again later", 429)
            _append_durably(self.run_dir / REQUESTS, req.model_dump_json().encode() + b"\n")
            self._requests[req.rollout_id] = req
            self._live[req.rollout_id] = self._pending(req, item)
            self._intake.put(item)
            return self._live[req.rollout_id]

    def result(self, rollout_id: str, wait: float = 0.0) -> RolloutResult:
        """The rollout as it is now, waiting up to `wait` seconds for it to settle; KeyError if unknown."""
        deadline = time.monotonic() + min(wait, MAX_WAIT)
        with self._lock:
            if rollout_id not in self._requests:
                raise KeyError(rollout_id)
            while not (result := self._result(rollout_id)).settled and (left := deadline - time.monotonic()) > 0:
                if self._stopping.is_set():
                    raise RequestRefused(f"the service stopped before rollout {rollout_id!r} settled; started again "
                                         "on the same run, it runs it", 503)
                self._lock.wait(left)
            return result

    def cancel(self, rollout_id: str) -> RolloutResult:
        """Drops a rollout that has not started (it settles as failed: cancelled); one that has runs on."""
        with self._lock:
            if rollout_id not in self._requests:
                raise KeyError(rollout_id)
            result = self._result(rollout_id)
            if result.state == "queued":
                self._cancelled.add(rollout_id)  # the loop starts nothing cancelled: both decide under this lock
            return result

    def set_policy(self, policy: Policy) -> Policy:
        """The policy the trainer is at now: rollouts asked without a model and version get it. Kept
        in the run (`policy.json`), so a restarted service serves it until the trainer sets another."""
        with self._lock:
            if policy.weights is not None:
                self._weights(policy.weights)
            try:
                atomic_write(self.run_dir / POLICY, policy.model_dump_json().encode())
            except OSError as exc:
                raise RequestRefused(f"cannot write {self.run_dir / POLICY}: {exc.strerror or exc}", 507) from None
            self._policy = policy
            return policy

    def tasks(self) -> TaskList:
        return TaskList(tasks=[TaskEntry(prompt_id=r.id, prompt=r.prompt) for r in self.by_id.values()])

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Calls `listener()` (from the loop's thread, quickly) whenever rollouts settle and when the
        loop ends, so a caller can wait without a thread (the HTTP server's long polls); returns
        what takes it off."""
        with self._lock:
            self._listeners.append(listener)

        def off() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return off

    def info(self) -> ServiceInfo:
        config = self.config
        with self._lock:
            states = Counter(r.state for r in self._live.values())
            settled, policy = len(self._where) + len(self._failed), self._policy
        temperature = sampling_temperature(config.temperature) if config.tokens == "exact" else config.temperature
        return ServiceInfo(run_name=config.run_name, model=config.model_label, temperature=temperature,
                           tokens=config.tokens, policy=policy, queued=states["queued"], running=states["running"],
                           policy_dir=str(self.policy_dir) if self.model_server else None,
                           settled=settled, tasks=len(self.by_id))

    # --- the loop (one thread: the only one that touches the run's store) ------------------------
    def _serve(self) -> None:
        try:
            self.spine.drive(_Requests(self), self.executor, deque())
        except RunAborted as exc:  # nothing more can run (a rejected key, every worker dead, the endpoint gone)
            self.failure = str(exc)
        except Exception as exc:  # the loop is the service: its end must be heard, not hang every caller
            self.failure = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.failure:
                say(f"error: the rollout service stopped: {self.failure}")
            self._stopping.set()
            with self._lock:
                self._changed()

    def _take(self, pending: deque[WorkItem]) -> None:
        """The requests acknowledged since the last turn into `pending`; the cancelled out of it, settled
        at once (not when a slot frees: the trainer is told now)."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._intake.get_nowait()
                self.spine.index_of[item.id] = item.index
                pending.append(item)
        with self._lock:
            dropped = [item for item in pending if item.id in self._cancelled] if self._cancelled else []
            self._cancelled.difference_update(item.id for item in dropped)
        for item in dropped:
            pending.remove(item)
            self.spine.settle(item, failure(item.id, item.index, item.attempt, "cancelled", "cancelled before it ran"))

    def _held_back(self, over: str, pending: deque[WorkItem]) -> None:
        """The budget is spent: new requests are refused, and the waiting ones told they will not run."""
        if not self._over:
            with self._lock:
                self._over = over
        while pending:
            item = pending.popleft()
            self.spine.settle(item, failure(item.id, item.index, item.attempt, "budget_spent",
                                            f"the run's budget is spent ({over})"))

    def _start_next(self, pending: deque[WorkItem], executor: Executor) -> bool:
        """Starts the first waiting rollout, on the weights it asks for: others are loaded once what
        runs on the loaded ones has settled (False until then)."""
        wanted = self._requests[pending[0].id].weights
        if self._weights_file(wanted) != self._loaded:
            if executor.in_flight():
                return False
            self._swap_weights(wanted, pending)
            return True
        self._start(pending.popleft())
        return True

    def _weights_file(self, name: str | None) -> tuple[str | None, tuple[int, ...]]:
        """A weights file as it is now: its name and identity, so a file written over under the same
        name (another training's) is loaded again."""
        if name is None or self.model_server is None:
            return name, ()
        try:
            st = (self.policy_dir / name).stat()
        except OSError:
            return name, ()
        return name, (st.st_ino, st.st_size, st.st_mtime_ns)

    def _swap_weights(self, wanted: str | None, pending: deque[WorkItem]) -> None:
        """Has the embedded model serve `wanted`; the rollouts waiting for weights it cannot serve fail, saying why."""
        file = self._weights_file(wanted)
        try:
            if self.model_server is None:  # asked of an earlier start of the run, on the embedded model
                raise LocalModelError(f"the service's model is {self.config.model_label}, not the embedded one")
            path = self.policy_dir / wanted if wanted else self.starting_weights
            started = time.monotonic()
            self.model_server.reload(path)
        except LocalModelError as exc:
            unusable = [item for item in pending if self._requests[item.id].weights == wanted]
            say(f"warning: the embedded model cannot serve {wanted}: {exc}; {len(unusable)} rollouts asked for it fail")
            for item in unusable:
                pending.remove(item)
                self.spine.settle(item, failure(item.id, item.index, item.attempt, "weights_unusable",
                                                f"the embedded model cannot serve {wanted}: {str(exc)[:500]}"))
            return
        self._loaded = file
        say(f"the embedded model serves {path.name} (loaded in {time.monotonic() - started:.1f} s)")

    def _weights(self, name: str) -> str:
        """A weights file a trainer names, checked: the model must be embedded and the file in its
        policy directory. Caller holds the lock."""
        if self.model_server is None:
            raise RequestRefused(f"weights: the service's model is {self.config.model_label}, not the embedded one; "
                                 "its server's weights are loaded by whoever runs it (TRL syncs a vLLM server itself)")
        if not (self.policy_dir / name).is_file():
            raise RequestRefused(f"weights: no file {name} in {self.policy_dir} (write it there first)", 404)
        return name

    def _start(self, item: WorkItem) -> None:
        with self._lock:
            cancelled = item.id in self._cancelled
            self._cancelled.discard(item.id)
            if not cancelled:  # from now on a cancel finds it running, and leaves it
                self._live[item.id] = self._live[item.id].model_copy(update={"state": "running"})
        if cancelled:
            self.spine.settle(item, failure(item.id, item.index, item.attempt, "cancelled", "cancelled before it ran"))
        elif (why := self.unavailable.get(item.image or "")) is not None:
            self.spine.settle(item, failure(item.id, item.index, item.attempt, "image_unavailable", why))
        else:
            self.executor.submit(item)

    def _settled_one(self, item: WorkItem, outcome: Outcome, entry: LedgerEntry) -> None:
        self._announce.append((item, outcome, entry))  # told once the next commit has it on disk

    def _tell_settled(self) -> None:
        """Outcomes are told only once they are on disk (the spine's commit calls this after its
        fsync): a rollout a trainer saw is never run again."""
        with self._lock:
            for item, outcome, entry in self._announce:
                req = self._requests[item.id]
                self._live.pop(item.id, None)
                if outcome.kind == "done":
                    self._where[item.id] = entry
                    self._remember(item.id, _from_record(req, json.loads(outcome.line)))
                else:
                    self._failed[item.id] = RolloutResult(
                        rollout_id=req.rollout_id, state="discarded" if outcome.kind == "discarded" else "failed",
                        model=_served_model(req) or self.config.model_label, policy_version=req.policy_version or 0,
                        error=outcome.reason if outcome.kind == "discarded" else f"{outcome.error_kind}: {outcome.error}")
            self._announce.clear()
            self._changed()

    def _changed(self) -> None:
        """Caller holds the lock."""
        self._lock.notify_all()
        for listener in list(self._listeners):
            listener()

    def _write_statistics(self) -> None:
        merged, stats = self.store.merge(self.state, self.spine.index_of)
        self.store.write_statistics({
            "run_name": self.config.run_name, "model": self.config.model_label, "backend": self.config.backend,
            "config_fingerprint": self.spine.fingerprint, "requests": len(self._requests),
            "merged_trajectories": merged, "failed": sum(r.state == "failed" for r in self._failed.values()),
            "discarded": sum(r.state == "discarded" for r in self._failed.values()),
            "completed_at": now_iso(), **stats.to_json()})

    # --- helpers -------------------------------------------------------------------------------
    def _task(self, task: str) -> PromptRecord:
        rec = self.by_id.get(task) or self.by_id.get(self.by_prompt.get(task, ""))
        if rec is None:
            if task in (r.prompt for r in self.by_id.values()):
                raise RequestRefused(f"task {task[:80]!r}: several rows have this prompt; name one by its prompt id")
            raise RequestRefused(f"task {task[:80]!r}: no prompt id or prompt of the service's dataset "
                                 f"{self.dataset.path}", 404)
        return rec

    def _item(self, req: RolloutRequest) -> WorkItem:
        """The request as one sample of its task's row: the record's id is the rollout's, its
        prompt_index the row's, its model the one asked, its row fields stamped with the version."""
        rec = self._task(req.task)
        return replace(self._item_for(rec), id=req.rollout_id, model=_served_model(req), attempt=1,
                       extra={**rec.extra, "policy_version": req.policy_version, "seed": req.seed})

    def _item_for(self, rec: PromptRecord) -> WorkItem:
        config = self.config
        dist = None if config.toolsets else distributions.get(config.distribution, set(config.plugins()))
        # a fresh state: the run's is the loop's alone, and a rollout is asked once (attempt 1)
        return work_item(config, rec, 0, dist, frozenset(config.toolsets_left_out), RunState())

    def _pending(self, req: RolloutRequest, item: WorkItem) -> RolloutResult:
        return RolloutResult(rollout_id=req.rollout_id, state="queued", prompt_id=item.prompt_id,
                             model=item.model or self.config.model_label, policy_version=req.policy_version or 0)

    def _result(self, rollout_id: str) -> RolloutResult:
        """Caller holds the lock."""
        for known in (self._live, self._failed):
            if rollout_id in known:
                return known[rollout_id]
        if rollout_id in self._recent:
            self._recent.move_to_end(rollout_id)
            return self._recent[rollout_id]
        entry = self._where[rollout_id]  # settled earlier: its record, read where the ledger says (flushed)
        with open(self.run_dir / entry.file, "rb") as f:
            f.seek(entry.offset)
            result = _from_record(self._requests[rollout_id], json.loads(f.read(entry.length)))
        self._remember(rollout_id, result)
        return result

    def _remember(self, rollout_id: str, result: RolloutResult) -> None:
        self._recent[rollout_id] = result
        while len(self._recent) > RECENT:
            self._recent.popitem(last=False)


class _Requests:
    """The service's requests as the spine's dispatch loop takes them (runner/spine.py: Feed)."""

    noun, wait = "rollout", 0.05  # a request waits at most this long for the loop to see it
    retries = False  # a failed rollout is the trainer's to ask again, under a new id
    closed = False

    def __init__(self, service: RolloutService) -> None:
        self.service = service

    @property
    def stopped(self) -> bool:
        return self.service.stopping

    def take(self, pending: deque[WorkItem]) -> None:
        self.service._take(pending)

    def held_back(self, over: str, pending: deque[WorkItem]) -> None:
        self.service._held_back(over, pending)

    def start(self, pending: deque[WorkItem], executor: Executor) -> bool:
        return self.service._start_next(pending, executor)


def _served_model(req: RolloutRequest) -> str | None:
    """The model a rollout names, in its record and answers: the one asked, else the embedded
    model's weights file; None: the service's --model."""
    return req.model or (f"local:{Path(req.weights).stem}" if req.weights else None)


def _from_record(req: RolloutRequest, record: dict[str, Any]) -> RolloutResult:
    verification = record.get("verification") or {}
    verdict = verification.get("status")
    score = verification.get("score")
    turns: list[RolloutTurn] = []
    refused = None
    if record.get("tokens"):
        trace = TokenTrace.read(record["tokens"])
        refused = refusal(trace, messages(record))
        aside = side_token_calls(record)  # a harness's asides are not the task's turns, nor its reward's
        for i, call in enumerate(trace.calls if refused is None else []):
            if i in aside:
                continue
            prompt = trace.prompt_of(i)
            if prompt is None or call.completion is None:
                continue  # ids the endpoint did not give (record mode): no token data for this call
            turns.append(RolloutTurn(prompt_ids=prompt, completion_ids=call.completion,
                                     logprobs=[None if math.isnan(lp) else lp for lp in call.logprobs],
                                     finish_reason=call.finish_reason))
    return RolloutResult(
        rollout_id=req.rollout_id, state="done", prompt_id=record.get("prompt_id"),
        model=record.get("metadata", {}).get("model"), policy_version=req.policy_version or 0,
        reward=float(score) if verdict in ("pass", "fail") and score is not None and refused is None else None,
        verdict=verdict, error=refused, turns=turns)


def wait_for(service: Any, rollout_id: str, timeout: float | None = None) -> RolloutResult:
    """The settled rollout from a service or its client, asking in long polls; TimeoutError past
    `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = MAX_WAIT if deadline is None else min(MAX_WAIT, deadline - time.monotonic())
        result: RolloutResult = service.result(rollout_id, max(0.0, left))
        if result.settled:
            return result
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"rollout {rollout_id} has not settled within {timeout:g} s ({result.state})")


def _append_durably(path: Path, line: bytes) -> None:
    """`line` at the end of `path` and on disk, or RequestRefused (507) with nothing of it left there:
    a torn line would swallow the next request written after it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"only {written} of {len(line)} bytes written")
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise RequestRefused(f"cannot write {path}: {exc.strerror or exc}", 507) from None
    finally:
        os.close(fd)
