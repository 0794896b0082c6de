"""The rollout service: one long-lived process that takes rollout requests (over HTTP, or in the
trainer's own process) and runs each through the same sandbox → agent → check → record as a batch
run, its worker processes, sandbox backend and embedded model kept warm from one request to the next.

    python batch_runner.py serve --dataset_file=tasks.jsonl --run_name=online --model=local

A request names a task of the service's dataset (its prompt id, or its prompt), the served model to
ask (a trainer's policy version, e.g. a LoRA adapter `{name}-v{N}`; the service's by default) and
that version's number, which every record of it carries. Its answer, once settled, is the rollout's
model calls as token ids with their log-probabilities (token-exact, `--tokens=exact` by default),
its check's reward (None where nothing decided it) and its verdict.

Nothing acknowledged is lost or run twice: a request is written to `requests.jsonl` (fsynced)
before it is acknowledged, its outcome to the run's batch files and ledger by the single writer
before it is announced. Started again on the same run after a crash (`kill -9`), the service runs
every acknowledged request that has no outcome, and answers the others from what it wrote; asked
again for a rollout id it knows, it answers with that rollout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import distributions
from ..config import ConfigError, RunConfig, check_fingerprint, configure
from ..dataset import PromptRecord, read_source
from ..episode import WorkItem, opening
from ..errors import RunAborted, UserError
from ..llm.local_model import embedded_endpoint
from ..record import Outcome, failure, now_iso
from ..runner.executor import warm_up
from ..runner.plan import work_item
from ..runner.spine import STOP_GRACE, Spine, check_tools
from ..store import RunStore
from ..tokens import TokenTrace
from ..tools import TOOLSETS
from ..util import say

REQUESTS = "requests.jsonl"  # every acknowledged request, in order: what a restarted service still owes
TOKEN_VARIABLE = "HERMES_BATCH_SERVE_TOKEN"  # the bearer token requests must carry (never a flag: ps shows flags)
SETTLED = ("done", "failed", "discarded")
MAX_WAIT = 60.0  # seconds a GET may hold its connection waiting for a rollout to settle


# --- the wire ----------------------------------------------------------------------------------
class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # the caller's, unique per rollout
    task: str = Field(min_length=1)  # a prompt id of the service's dataset, or one of its prompts
    seed: int | None = None  # the caller's (OpenEnv: its group's), kept in the record
    model: str | None = None  # the served model to ask (a policy version's adapter); None: the service's --model
    policy_version: int = Field(default=0, ge=0)  # the trainer's version of the weights `model` serves


class RolloutTurn(BaseModel):
    """One model call: the ids it was sent, the ids it returned and their log-probabilities (None
    where the server gave none)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float | None]
    finish_reason: str | None = None


class RolloutResult(BaseModel):
    rollout_id: str
    state: Literal["queued", "running", "done", "failed", "discarded"]
    prompt_id: str | None = None
    model: str | None = None
    policy_version: int = 0
    reward: float | None = None  # the check's score; None: no check, it could not judge, or no trajectory
    verdict: str | None = None  # pass, fail, error, skipped
    error: str | None = None  # failed or discarded: why
    turns: list[RolloutTurn] = Field(default_factory=list)

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


class ServiceInfo(BaseModel):
    run_name: str
    model: str
    temperature: float | None  # None: the endpoint's default
    tokens: str
    queued: int
    running: int
    settled: int
    tasks: int


class RequestRefused(ValueError):
    """A request the service cannot take; `status`: the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# --- the engine --------------------------------------------------------------------------------
class RolloutService:
    """Runs rollout requests as they come, in the run `data/<run_name>/` (see the module's doc).

    `flags`: the run's usual flags (`model`, `backend`, `toolsets`, `concurrency`, …); `tokens`
    is `exact` unless given. `max_queued`: requests waiting beyond those in flight before the
    service refuses more (HTTP 429). `start()` then `serve_forever()` (or `start(background=True)`
    in a trainer's process), `stop()` at the end."""

    def __init__(self, dataset_file: str | Path, *, run_name: str, output_dir: str | Path = "data",
                 max_queued: int | None = None, **flags: Any) -> None:
        given = {"require_reasoning": False, "tokens": "exact", **flags, "dataset_file": str(dataset_file),
                 "run_name": run_name, "output_dir": str(output_dir), "resume": True}
        self.config: RunConfig = configure(given)
        self.max_queued = max_queued if max_queued is not None else 4 * self.config.concurrency
        self.run_dir = self.config.run_dir
        self._lock = threading.Condition()
        self._intake: queue.Queue[WorkItem] = queue.Queue()
        self._cancelled: set[str] = set()
        self._requests: dict[str, RolloutRequest] = {}
        self._results: dict[str, RolloutResult] = {}
        self._announce: list[tuple[WorkItem, Outcome]] = []  # settled, to be told once fsynced
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._stack = contextlib.ExitStack()
        self.started = False

    # --- start and stop ------------------------------------------------------------------------
    def start(self, background: bool = False) -> None:
        config = self.config
        if config.executor == "local":
            warm_up()
        self.dataset = read_source(config.dataset_file or "", config.run_dir)
        records = self.dataset.records
        if not records:
            raise ConfigError(f"{self.dataset.path} has no usable rows ({len(self.dataset.problems)} rejected)")
        self.tasks: dict[str, PromptRecord] = {r.id: r for r in records}
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
        check_tools(config)
        self.state = self.store.scan()
        if self.store.has_outputs() and not config.allow_config_change:
            check_fingerprint(config, self.store.read_checkpoint(), self.state.fingerprints)
        if config.uses_local_model:
            common = Counter(tuple(self._item_for(r).toolsets) for r in records)
            url = self._stack.enter_context(embedded_endpoint(
                config.local_model, threads=config.local_threads, ctx=config.local_ctx,
                parallel=config.local_parallel, log_path=self.store.local_model_log, say=say,
                opening=opening(config, list(common.most_common(1)[0][0])), exact_cache=config.tokens == "exact"))
            self.config = config = config.model_copy(update={"base_url": url})
        self.api_key = config.resolved_api_key()
        self.spine = Spine(config, self.dataset, self.store, self.state, self.api_key)
        # every task's image now: a request for one that cannot be had fails at once, saying why
        self.unavailable = asyncio.run(self.spine.ready({r.sandbox_image or "": r.task.environment if r.task else None
                                                         for r in records}))
        self.spine.index_of = {}  # each rollout at its task's row: the merged file groups a task's rollouts
        self.spine.on_settled = self._settled_one
        self.spine.write_checkpoint(force=True)
        self._replay()
        self.executor = self.spine.executor(config.concurrency)
        self.executor.start()
        self._stack.callback(self.executor.stop, STOP_GRACE)
        say(f"serving {len(self.tasks)} tasks of {self.dataset.path}: model {config.model_label}, backend "
            f"{config.backend}, {config.concurrency} rollouts in flight, tokens {config.tokens}; run {self.run_dir}")

    def _replay(self) -> None:
        """The requests of an earlier life of this run: settled ones are answered from the store,
        the others run again (a torn last line was never acknowledged)."""
        path = self.run_dir / REQUESTS
        if not path.exists():
            return
        owed = 0
        for line in path.read_bytes().split(b"\n"):
            try:
                req = RolloutRequest.model_validate_json(line)
            except ValidationError:
                continue
            self._requests[req.rollout_id] = req
            try:
                item = self._item(req)
            except RequestRefused as exc:  # the dataset was edited since: it is settled as failed, and said why
                if not self.state.settled(req.rollout_id):
                    gone = WorkItem(id=req.rollout_id, index=0, prompt="", toolsets=[], batch_num=0)
                    self.spine.settle(gone, failure(gone.id, 0, 1, "task_gone", str(exc)))
                continue
            self.spine.index_of[req.rollout_id] = item.index
            if not self.state.settled(req.rollout_id):
                self._intake.put(item)
                self._results[req.rollout_id] = self._pending(req, "queued")
                owed += 1
        if self._requests:
            say(f"{len(self._requests)} requests of an earlier start: {len(self._requests) - owed} settled, "
                f"{owed} run again")

    def serve_forever(self) -> None:
        """The single writer's loop, until `stop()` (or Ctrl-C, SIGTERM in the main thread)."""
        self._serve()

    def stop(self) -> None:
        """Stops taking work, lets what is in flight finish for a grace period, writes the merged
        trajectories and statistics, and releases the workers, sandboxes and model."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if not self.started:
            return
        self.started = False
        try:
            self.executor.stop(STOP_GRACE)
            self._commit()
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
        """Takes a rollout (durably, before it returns); the same id again answers with that rollout."""
        with self._lock:
            if not self.started or self._stopping.is_set():
                raise RequestRefused("the service is stopping", 503)
            known = self._requests.get(req.rollout_id)
            if known is not None:
                if (known.task, known.model, known.policy_version) != (req.task, req.model, req.policy_version):
                    raise RequestRefused(f"rollout {req.rollout_id!r} was asked before with another task, model or "
                                         "policy version", 409)
                return self._result(req.rollout_id)
            if self._intake.qsize() >= self.max_queued:
                raise RequestRefused(f"{self.max_queued} requests are waiting already; ask again later", 429)
            item = self._item(req)  # an unknown task is refused here, before it is written
            with (self.run_dir / REQUESTS).open("ab") as f:
                f.write(req.model_dump_json().encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            self._requests[req.rollout_id] = req
            self.spine.index_of[req.rollout_id] = item.index
            self._results[req.rollout_id] = self._pending(req, "queued")
            self._intake.put(item)
            return self._results[req.rollout_id]

    def result(self, rollout_id: str, wait: float = 0.0) -> RolloutResult:
        """The rollout as it is now, waiting up to `wait` seconds for it to settle; KeyError if unknown."""
        deadline = time.monotonic() + wait
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
            if self._result(rollout_id).state == "queued":
                self._cancelled.add(rollout_id)
            return self._result(rollout_id)

    def info(self) -> ServiceInfo:
        with self._lock:
            states = Counter(r.state for r in self._results.values())
            settled = sum(self.state.settled(rid) for rid in self._requests)
        return ServiceInfo(run_name=self.config.run_name, model=self.config.model_label,
                           temperature=self.config.temperature, tokens=self.config.tokens, queued=states["queued"],
                           running=states["running"], settled=settled, tasks=len(self.tasks))

    # --- the loop (one thread) -----------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._dispatch()
        except Exception as exc:  # the loop is the service: its end must be heard, not hang every caller
            say(f"error: the rollout service stopped: {type(exc).__name__}: {exc}")
            raise
        finally:
            self._stopping.set()
            with self._lock:
                self._lock.notify_all()

    def _dispatch(self) -> None:
        pending: deque[WorkItem] = deque()
        last_commit = 0.0
        while not self._stopping.is_set():
            with contextlib.suppress(queue.Empty):
                while True:
                    pending.append(self._intake.get_nowait())
            while pending and self.executor.room() > 0:
                item = pending.popleft()
                if item.id in self._cancelled:
                    self.spine.settle(item, failure(item.id, item.index, item.attempt, "cancelled",
                                                    "cancelled before it ran"))
                elif (why := self.unavailable.get(item.image or "")) is not None:
                    self.spine.settle(item, failure(item.id, item.index, item.attempt, "image_unavailable", why))
                else:
                    self.executor.submit(item)
                    with self._lock:
                        self._results[item.id] = self._results[item.id].model_copy(update={"state": "running"})
            try:
                self.executor.poll(0.05 if pending or self.executor.in_flight() else 0.2)
            except RunAborted as exc:  # a rejected key: nothing more can run
                say(f"error: {exc}")
                self._stopping.set()
            self.spine._watchdog(self.executor)
            self.spine.requeue.clear()  # a failed rollout is the trainer's to ask again, under a new id
            if self._announce and time.monotonic() - last_commit >= 0.05:
                self._commit()
                last_commit = time.monotonic()
            self.spine.write_checkpoint()
            if not self.executor.alive():
                say("error: every worker process died; see the messages above")
                self._stopping.set()

    def _settled_one(self, item: WorkItem, outcome: Outcome) -> None:
        self._announce.append((item, outcome))  # told once the next commit has it on disk

    def _commit(self) -> None:
        """Outcomes are told only once they are on disk: a rollout a trainer saw is never run again."""
        self.store.flush()
        with self._lock:
            for item, outcome in self._announce:
                self._results[item.id] = _settled(self._requests[item.id], outcome)
            self._announce.clear()
            self._lock.notify_all()

    def _write_statistics(self) -> None:
        merged, stats = self.store.merge(self.state, self.spine.index_of)
        self.store.write_statistics({
            "run_name": self.config.run_name, "model": self.config.model_label, "backend": self.config.backend,
            "config_fingerprint": self.spine.fingerprint, "requests": len(self._requests),
            "merged_trajectories": merged, "failed": len(self.state.failed), "discarded": len(self.state.discarded),
            "completed_at": now_iso(), **stats.to_json()})

    # --- helpers -------------------------------------------------------------------------------
    def _task(self, task: str) -> PromptRecord:
        rec = self.tasks.get(task) or self.tasks.get(self.by_prompt.get(task, ""))
        if rec is None:
            same = task in (r.prompt for r in self.tasks.values())
            raise RequestRefused(f"task {task[:80]!r}: " + ("several rows have this prompt; name one by its prompt id"
                                                            if same else "no prompt id or prompt of the service's "
                                                            f"dataset {self.dataset.path}"), 404 if not same else 400)
        return rec

    def _item(self, req: RolloutRequest) -> WorkItem:
        """The request as a sample of its task's row: the record's id is the rollout's, its
        prompt_index the row's, its model the one asked, its row fields stamped with the version."""
        rec = self._task(req.task)
        return replace(self._item_for(rec), id=req.rollout_id, model=req.model,
                       attempt=self.state.attempts.get(req.rollout_id, 0) + 1,
                       extra={**rec.extra, "policy_version": req.policy_version, "seed": req.seed})

    def _item_for(self, rec: PromptRecord) -> WorkItem:
        config = self.config
        dist = None if config.toolsets else distributions.get(config.distribution, set(TOOLSETS))
        return work_item(config, rec, 0, dist, frozenset(config.toolsets_left_out), self.state)

    def _pending(self, req: RolloutRequest, state: Literal["queued", "running"]) -> RolloutResult:
        rec = self._task(req.task)
        return RolloutResult(rollout_id=req.rollout_id, state=state, prompt_id=rec.id,
                             model=req.model or self.config.model_label, policy_version=req.policy_version)

    def _result(self, rollout_id: str) -> RolloutResult:
        """Caller holds the lock. A rollout settled in an earlier life is read from the store once."""
        if rollout_id not in self._results:
            self._load_settled()
        return self._results[rollout_id]

    def _load_settled(self) -> None:
        kept = {rec["id"]: rec for rec in self.store.kept_records() if rec["id"] in self._requests}
        for rid, req in self._requests.items():
            if rid in self._results:
                continue
            if rid in kept:
                self._results[rid] = _from_record(req, kept[rid])
            else:
                why = self.state.failed.get(rid) or self.state.discarded.get(rid) or "not settled"
                state: Literal["failed", "discarded"] = "discarded" if rid in self.state.discarded else "failed"
                self._results[rid] = RolloutResult(rollout_id=rid, state=state, policy_version=req.policy_version,
                                                   model=req.model, error=why)


def _settled(req: RolloutRequest, outcome: Outcome) -> RolloutResult:
    if outcome.kind == "done":
        return _from_record(req, json.loads(outcome.line))
    return RolloutResult(rollout_id=req.rollout_id, state="discarded" if outcome.kind == "discarded" else "failed",
                         model=req.model, policy_version=req.policy_version,
                         error=outcome.reason if outcome.kind == "discarded" else f"{outcome.error_kind}: {outcome.error}")


def _from_record(req: RolloutRequest, record: dict[str, Any]) -> RolloutResult:
    verification = record.get("verification") or {}
    verdict = verification.get("status")
    score = verification.get("score")
    turns: list[RolloutTurn] = []
    if record.get("tokens"):
        trace = TokenTrace.read(record["tokens"])
        for i, call in enumerate(trace.calls):
            prompt = trace.prompt_of(i)
            if prompt is None or call.completion is None:
                continue  # ids the endpoint did not give (record mode): no token data for this call
            turns.append(RolloutTurn(prompt_ids=prompt, completion_ids=call.completion,
                                     logprobs=[None if math.isnan(lp) else lp for lp in call.logprobs],
                                     finish_reason=call.finish_reason))
    return RolloutResult(
        rollout_id=req.rollout_id, state="done", prompt_id=record.get("prompt_id"),
        model=record.get("metadata", {}).get("model"), policy_version=req.policy_version,
        reward=float(score) if verdict in ("pass", "fail") and score is not None else None,
        verdict=verdict, turns=turns)


# --- HTTP ----------------------------------------------------------------------------------------
class ServiceServer:
    """The service over HTTP: `POST /v1/rollouts` (a RolloutRequest; 202 with its RolloutResult),
    `GET /v1/rollouts/<id>?wait=S` (its RolloutResult, waiting up to S seconds for it to settle),
    `DELETE /v1/rollouts/<id>` (cancel it if it has not started), `GET /v1/info`. With a token,
    every request must carry `Authorization: Bearer <token>`."""

    def __init__(self, service: RolloutService, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        if not token and not _loopback(host):
            raise ConfigError(f"--host={host} is reachable from other machines: set {TOKEN_VARIABLE} to the token "
                              "requests must carry")
        handler = type("Handler", (_Handler,), {"service": service, "token": token})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rollout-http", daemon=True)

    def start(self) -> ServiceServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class _Handler(BaseHTTPRequestHandler):
    service: RolloutService
    token: str | None
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # a trainer asks many times a second; the run's log says what matters

    def _send(self, status: int, body: BaseModel | dict[str, Any]) -> None:
        data = body.model_dump_json().encode() if isinstance(body, BaseModel) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self) -> bool:
        if self.token and self.headers.get("Authorization", "") != f"Bearer {self.token}":
            self._send(401, {"error": "a valid 'Authorization: Bearer <token>' header is required"})
            return False
        return True

    def _rollout_id(self) -> str | None:
        parts = urlparse(self.path).path.strip("/").split("/")
        return parts[2] if len(parts) == 3 and parts[:2] == ["v1", "rollouts"] else None

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        if not self._allowed():
            return
        if urlparse(self.path).path.rstrip("/") != "/v1/rollouts":
            return self._send(404, {"error": f"no {self.path}: POST /v1/rollouts"})
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            req = RolloutRequest.model_validate_json(body)
            self._send(202, self.service.submit(req))
        except ValidationError as exc:
            self._send(400, {"error": f"not a rollout request: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"})
        except RequestRefused as exc:
            self._send(exc.status, {"error": str(exc)})

    def do_GET(self) -> None:  # noqa: N802
        if not self._allowed():
            return
        url = urlparse(self.path)
        if url.path.rstrip("/") == "/v1/info":
            return self._send(200, self.service.info())
        rid = self._rollout_id()
        if rid is None:
            return self._send(404, {"error": f"no {url.path}: GET /v1/rollouts/<id> or /v1/info"})
        try:
            wait = min(MAX_WAIT, float(parse_qs(url.query).get("wait", ["0"])[0]))
            self._send(200, self.service.result(rid, wait))
        except RequestRefused as exc:
            self._send(exc.status, {"error": str(exc)})
        except ValueError:
            self._send(400, {"error": "wait must be a number of seconds"})
        except KeyError:
            self._send(404, {"error": f"no rollout {rid!r} was asked of this service"})

    def do_DELETE(self) -> None:  # noqa: N802
        if not self._allowed():
            return
        rid = self._rollout_id()
        try:
            self._send(200, self.service.cancel(rid or ""))
        except KeyError:
            self._send(404, {"error": f"no rollout {rid!r} was asked of this service"})


class ServiceClient:
    """A rollout service over HTTP, with the in-process service's `submit`/`result`/`cancel`/`info`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        import httpx

        token = token if token is not None else os.environ.get(TOKEN_VARIABLE)
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout + MAX_WAIT,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})

    def _answer(self, res: Any) -> Any:
        if res.status_code >= 400:
            raise RequestRefused(f"{res.request.method} {res.request.url}: HTTP {res.status_code}: "
                                 f"{res.json().get('error', res.text) if res.headers.get('content-type') == 'application/json' else res.text}",
                                 res.status_code)
        return res.json()

    def submit(self, req: RolloutRequest) -> RolloutResult:
        return RolloutResult.model_validate(self._answer(self.http.post("/v1/rollouts", content=req.model_dump_json())))

    def result(self, rollout_id: str, wait: float = 0.0) -> RolloutResult:
        try:
            return RolloutResult.model_validate(
                self._answer(self.http.get(f"/v1/rollouts/{rollout_id}", params={"wait": min(wait, MAX_WAIT)})))
        except RequestRefused as exc:
            if exc.status == 404:
                raise KeyError(rollout_id) from None
            raise

    def cancel(self, rollout_id: str) -> RolloutResult:
        return RolloutResult.model_validate(self._answer(self.http.delete(f"/v1/rollouts/{rollout_id}")))

    def info(self) -> ServiceInfo:
        return ServiceInfo.model_validate(self._answer(self.http.get("/v1/info")))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_for(service: RolloutService | ServiceClient, rollout_id: str, timeout: float | None = None) -> RolloutResult:
    """The settled rollout, asking in long polls; TimeoutError past `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = MAX_WAIT if deadline is None else min(MAX_WAIT, deadline - time.monotonic())
        result = service.result(rollout_id, max(0.0, left))
        if result.settled:
            return result
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"rollout {rollout_id} has not settled within {timeout:g} s ({result.state})")


def serve(given: dict[str, Any], host: str = "127.0.0.1", port: int = 8177, max_queued: int | None = None) -> int:
    """`python batch_runner.py serve`: the service on `host:port` until Ctrl-C or SIGTERM."""
    import signal

    flags = dict(given)
    dataset_file, run_name = flags.pop("dataset_file", None), flags.pop("run_name", None)
    if not dataset_file or not run_name:
        raise ConfigError("serve needs --dataset_file (the tasks it runs) and --run_name (where it writes)")
    service = RolloutService(dataset_file, run_name=run_name, max_queued=max_queued, **flags)
    service.start()
    try:
        server = ServiceServer(service, host, port, os.environ.get(TOKEN_VARIABLE)).start()
    except OSError as exc:
        service.stop()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    say(f"rollouts at {server.url}/v1/rollouts (Ctrl-C stops; started again on the same run, it goes on)")

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        service.serve_forever()
    except KeyboardInterrupt:
        say("stopping: rollouts in flight get a grace period; the rest run when the service starts again")
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        service.stop()
    return 0
