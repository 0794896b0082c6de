"""The rollout service over HTTP (`python batch_runner.py serve`), and its client.

    POST   /v1/rollouts        a RolloutRequest → 202 and its RolloutResult
    GET    /v1/rollouts/<id>   its RolloutResult; `?wait=S`: waits up to S seconds (60 at most) for it to settle
    DELETE /v1/rollouts/<id>   drops it if it has not started
    POST   /v1/policy          a Policy: what rollouts naming none are served by
    GET    /v1/info            a ServiceInfo

With a token (`HERMES_BATCH_SERVE_TOKEN`, required off loopback), every request carries
`Authorization: Bearer <token>`. Errors are `{"error": "..."}` with 400, 401, 404, 409 (an id asked
again with other fields), 413, 429 (too many waiting), 503 (stopping, or the budget spent), 507."""

from __future__ import annotations

import hmac
import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ValidationError

from ..config import ConfigError
from ..errors import EXIT_FATAL, UserError
from ..util import say
from .service import MAX_WAIT, RolloutService
from .service_wire import Policy, RequestRefused, RolloutRequest, RolloutResult, ServiceInfo, TaskList

TOKEN_VARIABLE = "HERMES_BATCH_SERVE_TOKEN"  # the bearer token requests must carry (never a flag: ps shows flags)
MAX_BODY = 1 << 20  # bytes: a request is a few hundred
POSTED: dict[str, type[BaseModel]] = {"/v1/rollouts": RolloutRequest, "/v1/policy": Policy}


def check_host(host: str, token: str | None) -> None:
    """Off loopback, only with a token."""
    if not token and not host.startswith("127.") and host != "localhost":
        raise ConfigError(f"--host={host} is reachable from other machines: set {TOKEN_VARIABLE} to the token "
                          "requests must carry")


class ServiceServer:
    """`service` over HTTP on `host:port` (0: any free port; `url` says which), in threads of its own."""

    def __init__(self, service: RolloutService, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        check_host(host, token)
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


class _Handler(BaseHTTPRequestHandler):
    service: RolloutService
    token: str | None
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # a trainer asks many times a second; the run's log says what matters

    def _send(self, status: int, body: BaseModel | dict[str, Any]) -> None:
        data = body.model_dump_json().encode() if isinstance(body, BaseModel) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller left (a long poll given up): nothing to tell

    def _refuse(self, status: int, message: str) -> None:
        self._send(status, {"error": message})

    def _body(self) -> bytes | None:
        """The request's body, read whole before any answer (so the connection stays in step); None
        when its length is not one to read (answered, and the connection closed)."""
        if self.headers.get("Transfer-Encoding"):  # a chunked body: not read here, so the connection ends
            self.close_connection = True
            self._refuse(411, "send the body with a Content-Length")
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._refuse(413 if length > MAX_BODY else 400, f"Content-Length must be 0 to {MAX_BODY} bytes")
            return None
        return self.rfile.read(length)

    def _allowed(self) -> bool:
        given = self.headers.get("Authorization", "")
        if self.token and not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            self._refuse(401, "a valid 'Authorization: Bearer <token>' header is required")
            return False
        return True

    def _rollout_id(self) -> str | None:
        parts = urlparse(self.path).path.strip("/").split("/")
        return parts[2] if len(parts) == 3 and parts[:2] == ["v1", "rollouts"] else None

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self._body()
        if body is None or not self._allowed():
            return
        path = urlparse(self.path).path.rstrip("/")
        model = POSTED.get(path)
        if model is None:
            return self._refuse(404, f"no {path}: POST /v1/rollouts or /v1/policy")
        try:
            given = model.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            return self._refuse(400, f"not a {model.__name__}: {'.'.join(map(str, first['loc']))}: {first['msg']}")
        try:
            if isinstance(given, RolloutRequest):
                self._send(202, self.service.submit(given))
            else:
                assert isinstance(given, Policy)
                self._send(200, self.service.set_policy(given))
        except RequestRefused as exc:
            self._refuse(exc.status, str(exc))

    def do_GET(self) -> None:  # noqa: N802
        if self._body() is None or not self._allowed():
            return
        url = urlparse(self.path)
        if url.path.rstrip("/") == "/v1/info":
            return self._send(200, self.service.info())
        if url.path.rstrip("/") == "/v1/tasks":
            return self._send(200, self.service.tasks())
        rid = self._rollout_id()
        if rid is None:
            return self._refuse(404, f"no {url.path}: GET /v1/rollouts/<id>, /v1/tasks or /v1/info")
        try:
            wait = float(parse_qs(url.query).get("wait", ["0"])[0])
        except ValueError:
            return self._refuse(400, "wait must be a number of seconds")
        try:
            self._send(200, self.service.result(rid, wait))
        except RequestRefused as exc:
            self._refuse(exc.status, str(exc))
        except KeyError:
            self._refuse(404, f"no rollout {rid!r} was asked of this service")

    def do_DELETE(self) -> None:  # noqa: N802
        if self._body() is None or not self._allowed():
            return
        rid = self._rollout_id()
        try:
            self._send(200, self.service.cancel(rid or ""))
        except KeyError:
            self._refuse(404, f"no rollout {rid!r} was asked of this service")


class ServiceClient:
    """A rollout service over HTTP, with the in-process service's calls (`submit`, `result`,
    `cancel`, `set_policy`, `info`, `tasks`); RequestRefused carries the service's status and reason."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        import httpx

        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_VARIABLE)
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
    token = os.environ.get(TOKEN_VARIABLE)
    check_host(host, token)  # before the model and the workers start
    service = RolloutService(dataset_file, run_name=run_name, max_queued=max_queued, **flags)
    service.start()
    try:
        server = ServiceServer(service, host, port, token).start()
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
        say("stopping: rollouts in flight are stopped; they run again when the service starts again on this run")
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        service.stop()
    return EXIT_FATAL if service.failure else 0  # a loop that ended on its own: a supervisor restarts it
