"""The rollout service over HTTP (`python batch_runner.py serve`), and its client.

    POST   /v1/rollouts        a RolloutRequest → 202 and its RolloutResult
    GET    /v1/rollouts/<id>   its RolloutResult; `?wait=S`: waits up to S seconds (60 at most) for it to settle
    DELETE /v1/rollouts/<id>   drops it if it has not started
    POST   /v1/policy          a Policy: what rollouts naming none are served by
    GET    /v1/info            a ServiceInfo
    GET    /v1/tasks           a TaskList

Every request carries `Authorization: Bearer <token>`, on loopback too: a rollout's own agent may
reach this machine's loopback. The token is `HERMES_BATCH_SERVE_TOKEN` (never a flag: ps shows
flags), else one made at start, said once and written to `<run>/service.token`, which only its user
may read. It is checked on the request's head: a request without it is answered 401 and its
connection closed, its body never read. Errors are `{"error": "..."}` with 400, 401, 404, 405, 408,
409 (an id asked again with other fields), 411, 413, 429 (too many waiting), 431, 500, 503
(stopping, or the budget spent), 507.

One event loop holds the connections, so a connection costs no thread while it sends its head or
waits for a rollout: its head must come whole within `head_timeout` seconds of its opening (or of
its last answer), a body within BODY_TIMEOUT; at most `max_connections` are open, and past that the
one waiting longest for its head is closed. The service's own calls run on MAX_HANDLERS threads."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import json
import math
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ValidationError

from ...config import ConfigError
from ...errors import EXIT_FATAL, UserError
from ...util import say
from .rollouts import MAX_WAIT, RolloutService
from .wire import Policy, RequestRefused, RolloutRequest, RolloutResult, ServiceInfo, TaskList

TOKEN_VARIABLE = "HERMES_BATCH_SERVE_TOKEN"  # the bearer token requests must carry (never a flag: ps shows flags)
TOKEN_FILE = "service.token"  # in the run directory, its user's only: where a trainer on this machine finds it
MAX_BODY = 1 << 20  # bytes: a request is a few hundred
MAX_HEAD = 16 << 10  # bytes of a request line and headers
HEAD_TIMEOUT = 10.0  # seconds for a whole head, from a connection's opening or its last answer (httpx keeps 5 s)
BODY_TIMEOUT = 10.0  # seconds for a body the token let in
MAX_CONNECTIONS = 256  # open at once
MAX_HANDLERS = 8  # threads running the service's calls (a long poll waits on the loop, not on one)
POSTED: dict[str, type[BaseModel]] = {"/v1/rollouts": RolloutRequest, "/v1/policy": Policy}
Answer = tuple[int, BaseModel | dict[str, Any]]


def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8, ::1 (bracketed or not)."""
    name = host.strip().removeprefix("[").removesuffix("]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_address(host: str, port: int, token: str | None) -> None:
    """A port there is, and off loopback a token the user chose (a remote trainer must be given it)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port={port!r}: give a port from 1 to 65535")
    if not token and not is_loopback(host):
        raise ConfigError(f"--host={host} is reachable from other machines: set {TOKEN_VARIABLE} to the token "
                          "requests must carry")


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on the first address `host` names (IPv4 or IPv6); OSError if there is none."""
    family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class ServiceServer:
    """`service` over HTTP on `host:port` (0: any free port; `url` says which), on a thread of its
    own; `token`: what requests must carry (None: one is made, `token` says which)."""

    def __init__(self, service: RolloutService, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 *, max_connections: int = MAX_CONNECTIONS, head_timeout: float = HEAD_TIMEOUT):
        check_address(host, port, token)
        self.service = service
        self.token = token or secrets.token_urlsafe(32)
        self.max_connections, self.head_timeout = max_connections, head_timeout
        self._sock = _listen(host, port)
        address = self._sock.getsockname()
        shown = f"[{address[0]}]" if self._sock.family == socket.AF_INET6 else address[0]
        self.url = f"http://{shown}:{address[1]}"
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(MAX_HANDLERS, thread_name_prefix="rollout-http")
        self._open: dict[asyncio.StreamWriter, float | None] = {}  # each connection → since when it waits for a head
        self._changed = asyncio.Event()  # set, and replaced, each time rollouts settle: what long polls wait on
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: self._loop.run_until_complete(self._main()),
                                        name="rollout-http", daemon=True)
        self._unlisten: Callable[[], None] | None = None

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def start(self) -> ServiceServer:
        self._thread.start()
        self._ready.wait()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sock.close()
        if not self._loop.is_running():
            self._loop.close()

    # --- the loop ----------------------------------------------------------------------------
    async def _main(self) -> None:
        loop = asyncio.get_running_loop()

        def changed() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed since
                loop.call_soon_threadsafe(self._wake)

        self._unlisten = self.service.on_change(changed)
        server = await asyncio.start_server(self._connection, sock=self._sock, limit=MAX_HEAD)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            self._unlisten()
            server.close()
            for writer in list(self._open):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open[writer] = time.monotonic()
        if len(self._open) > self.max_connections:  # room for it: the one waiting longest for its head goes
            waiting = [(since, w) for w, since in self._open.items() if since is not None and w is not writer]
            (min(waiting, key=lambda sw: sw[0])[1] if waiting else writer).transport.abort()
        try:
            while await self._exchange(reader, writer):
                self._open[writer] = time.monotonic()
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # gone, too slow, or closed to make room: nothing to answer
        finally:
            self._open.pop(writer, None)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request and its answer; whether the connection stays open."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout)
        except asyncio.LimitOverrunError:
            return await self._send(writer, (431, {"error": f"the request's head is over {MAX_HEAD} bytes"}), False)
        self._open[writer] = None  # answering: not one to close for room
        request = _Request.read(head)
        if request is None:
            return await self._send(writer, (400, {"error": "not an HTTP/1.x request"}), False)
        if not hmac.compare_digest(request.headers.get("authorization", "").encode(), f"Bearer {self.token}".encode()):
            return await self._send(writer, (401, {"error": "a valid 'Authorization: Bearer <token>' header is "
                                                            "required: the token serve said at start (also in "
                                                            f"its run's {TOKEN_FILE})"}), False)
        if request.headers.get("transfer-encoding"):  # a chunked body is not read here
            return await self._send(writer, (411, {"error": "send the body with a Content-Length"}), False)
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_BODY:
            status = 413 if length.isdigit() else 400
            return await self._send(writer, (status, {"error": f"Content-Length must be 0 to {MAX_BODY} bytes"}), False)
        try:
            body = await asyncio.wait_for(reader.readexactly(int(length)), BODY_TIMEOUT)
        except TimeoutError:
            return await self._send(writer, (408, {"error": f"the body did not come within {BODY_TIMEOUT:g} s"}), False)
        try:
            answer = await self._route(request, body)
        except Exception as exc:  # a fault of the service's own: said to the caller, the server serves on
            answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
        return await self._send(writer, answer, request.keep_alive)

    async def _send(self, writer: asyncio.StreamWriter, answer: Answer, keep_alive: bool) -> bool:
        status, body = answer
        data = body.model_dump_json().encode() if isinstance(body, BaseModel) else json.dumps(body).encode()
        close = "" if keep_alive else "Connection: close\r\n"
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n{close}\r\n")
        writer.write(head.encode() + data)
        await asyncio.wait_for(writer.drain(), self.head_timeout)
        return keep_alive

    # --- the routes ----------------------------------------------------------------------------
    async def _route(self, request: _Request, body: bytes) -> Answer:
        url = urlparse(request.target)
        path = url.path.rstrip("/")
        parts = path.strip("/").split("/")
        rid = parts[2] if len(parts) == 3 and parts[:2] == ["v1", "rollouts"] else None
        try:
            if request.method == "POST":
                return await self._post(path, body)
            if request.method == "GET" and path == "/v1/info":
                return 200, await self._call(self.service.info)
            if request.method == "GET" and path == "/v1/tasks":
                return 200, await self._call(self.service.tasks)
            if request.method not in ("GET", "DELETE"):
                return 405, {"error": f"{request.method}: GET, POST or DELETE"}
            if rid is None:
                return 404, {"error": f"no {url.path}: GET /v1/rollouts/<id>, /v1/tasks or /v1/info"}
            if request.method == "DELETE":
                return 200, await self._call(self.service.cancel, rid)
            try:
                wait = float(parse_qs(url.query).get("wait", ["0"])[0])
            except ValueError:
                wait = math.nan
            if not math.isfinite(wait):
                return 400, {"error": "wait must be a number of seconds"}
            return 200, await self._result(rid, wait)
        except RequestRefused as exc:
            return exc.status, {"error": str(exc)}
        except KeyError:
            return 404, {"error": f"no rollout {rid!r} was asked of this service"}

    async def _post(self, path: str, body: bytes) -> Answer:
        model = POSTED.get(path)
        if model is None:
            return 404, {"error": f"no {path}: POST /v1/rollouts or /v1/policy"}
        try:
            given = model.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            return 400, {"error": f"not a {model.__name__}: {'.'.join(map(str, first['loc']))}: {first['msg']}"}
        if isinstance(given, RolloutRequest):
            return 202, await self._call(self.service.submit, given)
        return 200, await self._call(self.service.set_policy, given)

    async def _result(self, rollout_id: str, wait: float) -> RolloutResult:
        """The rollout, once settled or `wait` seconds on: the wait holds no thread."""
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
        while True:
            changed = self._changed  # taken before looking, so a settling in between wakes it
            result: RolloutResult = await self._call(self.service.result, rollout_id, 0.0)
            left = deadline - time.monotonic()
            if result.settled or left <= 0:
                return result
            if self.service.stopping:
                raise RequestRefused(f"the service stopped before rollout {rollout_id!r} settled; started again on "
                                     "the same run, it runs it", 503)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))


class _Request:
    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]):
        self.method, self.target, self.headers = method, target, headers
        self.keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"

    @classmethod
    def read(cls, head: bytes) -> _Request | None:
        """The request line and headers (names in lower case); None if they are not HTTP/1.x's."""
        lines = head.decode("latin-1").split("\r\n")
        words = lines[0].split(" ")
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            return None
        headers: dict[str, str] = {}
        for line in filter(None, lines[1:]):
            name, colon, value = line.partition(":")
            key = name.lower()
            if not colon or not name or name != name.strip() or (key in headers and key in ("content-length",
                                                                                          "authorization")):
                return None  # a header split oddly or given twice: read two ways by two readers
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        return cls(words[0], words[1], words[2], headers)


class ServiceClient:
    """A rollout service over HTTP, with the in-process service's calls (`submit`, `result`,
    `cancel`, `set_policy`, `info`, `tasks`); RequestRefused carries the service's status and reason."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        import httpx

        self.url = url.rstrip("/")
        token = (token if token is not None else os.environ.get(TOKEN_VARIABLE) or "").strip()
        # as many connections as callers: a trainer's threads each hold one in a long poll
        self.http = httpx.Client(base_url=self.url, timeout=timeout + MAX_WAIT, trust_env=False,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                                 headers={"Authorization": f"Bearer {token}"} if token else {})

    def _answer(self, res: Any) -> Any:
        if res.status_code >= 400:
            try:
                why = res.json()["error"]
            except (ValueError, KeyError, TypeError):
                why = res.text[:300]
            raise RequestRefused(f"{res.request.method} {res.request.url}: HTTP {res.status_code}: {why}",
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

    def set_policy(self, policy: Policy) -> Policy:
        return Policy.model_validate(self._answer(self.http.post("/v1/policy", content=policy.model_dump_json())))

    def info(self) -> ServiceInfo:
        return ServiceInfo.model_validate(self._answer(self.http.get("/v1/info")))

    def tasks(self) -> TaskList:
        return TaskList.model_validate(self._answer(self.http.get("/v1/tasks")))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve(given: dict[str, Any], host: str = "127.0.0.1", port: int = 8177, max_queued: int | None = None) -> int:
    """`python batch_runner.py serve`: the service on `host:port` until Ctrl-C or SIGTERM."""
    flags = dict(given)
    dataset_file, run_name = flags.pop("dataset_file", None), flags.pop("run_name", None)
    if not dataset_file or not run_name:
        raise ConfigError("serve needs --dataset_file (the tasks it runs) and --run_name (where it writes)")
    token = os.environ.get(TOKEN_VARIABLE) or None
    check_address(host, port, token)  # before the model and the workers start
    service = RolloutService(dataset_file, run_name=run_name, max_queued=max_queued, **flags)
    try:
        server = ServiceServer(service, host, port, token)  # listening, answered once started
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    token_file = service.run_dir / TOKEN_FILE
    try:
        service.start()  # holds the run: a second service on it stops here, before the token file is written
        write_token(token_file, server.token)
        server.start()
    except BaseException:
        server.close()
        service.stop()
        raise
    say(f"rollouts at {server.url}/v1/rollouts (Ctrl-C stops; started again on the same run, it goes on)")
    say(f"token: {'from ' + TOKEN_VARIABLE if token else server.token} (in {token_file} too, readable by you only; "
        "every request carries it as 'Authorization: Bearer <token>')")

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        service.serve_forever()
    except KeyboardInterrupt:
        say("stopping: rollouts in flight are stopped; they run again when the service starts again on this run")
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        token_file.unlink(missing_ok=True)
        service.stop()
    return EXIT_FATAL if service.failure else 0  # a loop that ended on its own: a supervisor restarts it


def write_token(path: Path, token: str) -> None:
    """The token in `path`, readable by its user only from the moment the file exists."""
    part = path.with_name(path.name + ".part")
    part.unlink(missing_ok=True)
    with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(token)
    os.replace(part, path)
