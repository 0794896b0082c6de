"""A loopback double of Flame's frontend: real gRPC, flamepy's own generated stubs, tasks run as
local subprocesses the way flmexec runs them (stdout only, exit status ignored).

It keeps the server semantics the backend relies on: open-or-create by id, "session <id> is not
open" for a closed session (INVALID_ARGUMENT), "spec mismatch", ALREADY_EXISTS on a duplicate
create, no closing while tasks run, pending tasks Cancelled (4) on close, per-session
concurrency from max_instances, WatchTask streaming whole Task messages. Faults can be injected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from flamepy.proto import frontend_pb2_grpc, types_pb2

PENDING, RUNNING, SUCCEED, FAILED, CANCELLED = 0, 1, 2, 3, 4
OPEN, CLOSED = 0, 1


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Task:
    id: str
    session_id: str
    input: bytes
    state: int = PENDING
    output: bytes | None = None
    events: list = field(default_factory=list)
    created: int = field(default_factory=now_ms)
    completed: int | None = None


@dataclass
class _Session:
    id: str
    spec: types_pb2.SessionSpec
    state: int = OPEN
    created: int = field(default_factory=now_ms)
    completed: int | None = None
    tasks: dict = field(default_factory=dict)
    slots: threading.Semaphore = None


class FlameDouble(frontend_pb2_grpc.FrontendServicer):
    def __init__(self, applications=("flmexec",), script_root: str | None = None):
        self.applications = set(applications)
        self.sessions: dict[str, _Session] = {}
        self.cond = threading.Condition()
        self.script_root = script_root or tempfile.mkdtemp(prefix="flame-double-")
        self.fail_create_task: dict[str, int] = {}  # session id → how many CreateTask calls to refuse
        # fault hook: (session id, task id) → "fail" (ends Failed, as on a lost executor), "hang", or None
        self.task_fault = lambda session_id, task_id: None
        self._released = threading.Event()
        self.executed = 0
        self.max_running = 0
        self._running = 0
        self._runners = futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="flmexec")
        self.server = None
        self.endpoint = ""

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=256))  # each watch pins a thread
        frontend_pb2_grpc.add_FrontendServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self.endpoint

    def stop(self) -> None:
        self._released.set()
        if self.server is not None:
            self.server.stop(grace=0.5).wait(5)
        self._runners.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self.script_root, ignore_errors=True)

    # --- test helpers ------------------------------------------------------------------------
    def close_externally(self, session_id: str) -> None:
        with self.cond:
            s = self.sessions[session_id]
            s.state, s.completed = CLOSED, now_ms()

    def open_ids(self, prefix: str = "") -> list[str]:
        with self.cond:
            return sorted(i for i, s in self.sessions.items() if s.state == OPEN and i.startswith(prefix))

    # --- messages ----------------------------------------------------------------------------
    def _session_msg(self, s: _Session) -> types_pb2.Session:
        counts = {st: sum(1 for t in s.tasks.values() if t.state == st) for st in range(5)}
        status = types_pb2.SessionStatus(state=s.state, creation_time=s.created, pending=counts[PENDING],
                                         running=counts[RUNNING], succeed=counts[SUCCEED], failed=counts[FAILED],
                                         cancelled=counts[CANCELLED])
        if s.completed is not None:
            status.completion_time = s.completed
        return types_pb2.Session(metadata=types_pb2.Metadata(id=s.id, name=s.id), spec=s.spec, status=status)

    def _task_msg(self, t: _Task) -> types_pb2.Task:
        spec = types_pb2.TaskSpec(session_id=t.session_id, input=t.input)
        if t.output is not None:
            spec.output = t.output
        status = types_pb2.TaskStatus(state=t.state, creation_time=t.created, events=t.events)
        if t.completed is not None:
            status.completion_time = t.completed
        return types_pb2.Task(metadata=types_pb2.Metadata(id=t.id, name=t.id), spec=spec, status=status)

    @staticmethod
    def _spec_key(spec: types_pb2.SessionSpec):
        return (spec.application, spec.min_instances, spec.max_instances if spec.HasField("max_instances") else None,
                spec.priority, spec.resreq.SerializeToString())

    def _new_session(self, sid: str, spec: types_pb2.SessionSpec, context) -> _Session:
        if spec.application not in self.applications:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"application <{spec.application}> not found")
        limit = spec.max_instances if spec.HasField("max_instances") and spec.max_instances else 1024
        s = _Session(id=sid, spec=spec, slots=threading.Semaphore(limit))
        self.sessions[sid] = s
        return s

    # --- sessions ----------------------------------------------------------------------------
    def CreateSession(self, request, context):
        with self.cond:
            if request.session_id in self.sessions:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"session <{request.session_id}> already exists")
            return self._session_msg(self._new_session(request.session_id or uuid.uuid4().hex[:8], request.session, context))

    def OpenSession(self, request, context):
        with self.cond:
            s = self.sessions.get(request.session_id)
            if s is None:
                if not request.HasField("session"):
                    context.abort(grpc.StatusCode.NOT_FOUND, f"session <{request.session_id}> not found")
                return self._session_msg(self._new_session(request.session_id, request.session, context))
            if s.state != OPEN:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"session {s.id} is not open")
            if request.HasField("session") and self._spec_key(request.session) != self._spec_key(s.spec):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"session {s.id} spec mismatch")
            return self._session_msg(s)

    def CloseSession(self, request, context):
        with self.cond:
            s = self.sessions.get(request.session_id)
            if s is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"session <{request.session_id}> not found")
            if any(t.state == RUNNING for t in s.tasks.values()):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Cannot close session with running tasks")
            for t in s.tasks.values():
                if t.state == PENDING:
                    t.state, t.completed = CANCELLED, now_ms()
            s.state, s.completed = CLOSED, now_ms()
            self.cond.notify_all()
            return self._session_msg(s)

    def DeleteSession(self, request, context):
        with self.cond:
            s = self.sessions.pop(request.session_id, None)
            if s is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"session <{request.session_id}> not found")
            return self._session_msg(s)

    def GetSession(self, request, context):
        with self.cond:
            s = self.sessions.get(request.session_id)
            if s is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"session <{request.session_id}> not found")
            return self._session_msg(s)

    def ListSession(self, request, context):
        with self.cond:
            return types_pb2.SessionList(sessions=[self._session_msg(s) for s in self.sessions.values()])

    def GetApplication(self, request, context):
        if request.name not in self.applications:
            context.abort(grpc.StatusCode.NOT_FOUND, f"application <{request.name}> not found")
        return types_pb2.Application(
            metadata=types_pb2.Metadata(id=request.name, name=request.name),
            spec=types_pb2.ApplicationSpec(shim=0, command="${FLAME_HOME}/bin/flmexec-service"),
            status=types_pb2.ApplicationStatus(state=0, creation_time=now_ms()),
        )

    # --- tasks -------------------------------------------------------------------------------
    def CreateTask(self, request, context):
        sid = request.task.session_id
        with self.cond:
            if self.fail_create_task.get(sid, 0) > 0:
                self.fail_create_task[sid] -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure: executor lost")
            s = self.sessions.get(sid)
            if s is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"session <{sid}> not found")
            if s.state != OPEN:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"session {sid} is not open")
            t = _Task(id=str(len(s.tasks) + 1), session_id=sid, input=request.task.input)
            s.tasks[t.id] = t
            msg = self._task_msg(t)
        self._runners.submit(self._run, s, t)
        return msg

    def GetTask(self, request, context):
        with self.cond:
            t = self._find(request, context)
            return self._task_msg(t)

    def WatchTask(self, request, context):
        last = None
        while context.is_active():
            with self.cond:  # never held across a yield: the stream's consumer may be slow
                t = self._find(request, context)
                if t.state == last:
                    self.cond.wait(0.5)
                    continue
                last, msg = t.state, self._task_msg(t)
            yield msg
            if last in (SUCCEED, FAILED, CANCELLED):
                return

    def ListTask(self, request, context):
        with self.cond:
            s = self.sessions.get(request.session_id)
            tasks = list(s.tasks.values()) if s else []
            msgs = [self._task_msg(t) for t in tasks]
        yield from msgs

    def _find(self, request, context) -> _Task:
        s = self.sessions.get(request.session_id)
        t = s.tasks.get(request.task_id) if s else None
        if t is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"task <{request.session_id}/{request.task_id}> not found")
        return t

    # --- flmexec -----------------------------------------------------------------------------
    def _run(self, s: _Session, t: _Task) -> None:
        with s.slots:
            with self.cond:
                if t.state != PENDING:
                    return  # cancelled while queued
                t.state = RUNNING
                self._running += 1
                self.max_running = max(self.max_running, self._running)
                self.cond.notify_all()
            try:
                fault = self.task_fault(s.id, t.id)
                if fault == "hang":
                    self._released.wait()
                if fault == "fail":
                    raise RuntimeError("injected executor failure")
                state, output, message = self._flmexec(t.input)
            except Exception as exc:  # the double must never wedge a watcher
                state, output, message = FAILED, None, f"{exc}"
            with self.cond:
                self._running -= 1
                self.executed += 1
                t.state, t.output, t.completed = state, output, now_ms()
                if message:
                    t.events.append(types_pb2.Event(code=state, message=message, creation_time=now_ms()))
                self.cond.notify_all()

    def _flmexec(self, raw: bytes):
        """As flmexec: the code in a fresh script dir, stdout captured, stderr to the logs, exit status ignored."""
        try:
            req = json.loads(raw)
            language, code = req["language"], req["code"]
        except (ValueError, KeyError, TypeError) as exc:
            return FAILED, None, f"invalid flmexec request: {exc}"
        if language not in ("python", "shell"):
            return FAILED, None, f"unsupported language: {language}"
        workdir = tempfile.mkdtemp(prefix=f"{language}-", dir=self.script_root)
        try:
            main = os.path.join(workdir, "main.py" if language == "python" else "main.sh")
            with open(main, "w", encoding="utf-8") as f:
                f.write(code)
            argv = [sys.executable, main] if language == "python" else ["bash", main]
            # an executor's environment is its own, never the client's
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8"}
            data = req.get("input")
            proc = subprocess.run(argv, cwd=workdir, env=env, input=bytes(data) if data else None,
                                  stdin=None if data else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return SUCCEED, json.dumps({"data": list(proc.stdout)}).encode(), ""


def flame_backend_under_test(request, tmp_path):
    """The conformance suite's Flame entry: the double on loopback, the backend pointed at it."""
    from tests.backend_harness import BackendUnderTest, make_settings

    double = FlameDouble()
    endpoint = double.start()
    mp = request.getfixturevalue("monkeypatch")
    mp.setenv("FLAME_ENDPOINT", endpoint)
    mp.setenv("HOME", str(tmp_path))  # no ~/.flame/flame.yaml of the machine's
    for var in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        mp.delenv(var, raising=False)
    but = BackendUnderTest("flame", make_settings(tmp_path), None, cleanup=double.stop)
    but.double = double
    return but
