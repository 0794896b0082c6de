"""The interception endpoint: what a harness running inside a prompt's sandbox takes for its model.

The runner serves it into each such sandbox alone, on the sandbox's own loopback at `BASE_URL`
(a listening socket placed in the sandbox's network: backends/egress.py), and answers every call
through the run's own model client: the run's model, sampling and `--max_tokens` whatever the
harness asks (what it asked is kept), its limits and retries, and with `--tokens=exact` the
prompt's token trace. Each prompt's harness has a key of its own, good for its own sandbox's
endpoint and only while its prompt runs; the run's API keys never enter a sandbox. Every call is
kept (`Line.calls`): the record is rebuilt from them (transcript.py).

It speaks OpenAI Chat Completions (`POST /v1/chat/completions`, streamed as server-sent events or
not) and lists the run's model (`GET /v1/models`)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..backends import Sandbox
from ..llm import Completion, FatalRunError, ModelClient, PromptFailed

HARNESS_PORT = 4000  # on the sandbox's own loopback
BASE_URL = f"http://127.0.0.1:{HARNESS_PORT}/v1"
MAX_BODY = 64 * 1024 * 1024  # a long history with its tool results
# what a harness may ask that the run decides instead (kept in the call's record as asked)
OVERRIDDEN = ("model", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "seed", "n",
              "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "reasoning_effort")


@dataclass
class Call:
    """One model call of a harness: what it sent, what it was answered (or why not)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    asked: dict[str, Any]  # the harness's own settings the run overrode
    reply: Completion | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass
class Line:
    """One prompt's line to the model."""

    key: str
    llm: ModelClient
    max_calls: int
    trace: Any = None  # the prompt's tokens.TokenTrace (--tokens=exact)
    model: str | None = None  # a served model other than the run's (a rollout's policy version)
    calls: list[Call] = field(default_factory=list)
    open: bool = True
    fatal: FatalRunError | None = None  # the run must stop (a rejected key): the episode raises it
    _stop: Any = None

    def allowed(self, authorization: str) -> bool:
        given = authorization.removeprefix("Bearer ").strip()
        return self.open and hmac.compare_digest(given.encode(), self.key.encode())

    async def answer(self, body: dict[str, Any]) -> Call:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("`messages` must be a non-empty list")
        tools = body.get("tools") or []
        call = Call(messages, tools if isinstance(tools, list) else [],
                    {k: body[k] for k in OVERRIDDEN if k in body})
        self.calls.append(call)
        started = time.monotonic()
        tool_choice = body.get("tool_choice")
        try:
            call.reply = await self.llm.complete(messages, call.tools, tool_choice if tool_choice != "auto" else None,
                                                 trace=self.trace, model=self.model)
        except PromptFailed as exc:
            call.error = f"{exc.kind}: {exc}"
        except FatalRunError as exc:
            self.fatal = exc
            call.error = str(exc)
        call.seconds = time.monotonic() - started
        return call

    async def close(self) -> None:
        self.open = False
        if self._stop is not None:
            await self._stop()


class Intercept:
    """A worker's endpoint: one line per prompt whose harness runs, served into its sandbox."""

    def __init__(self, llm: ModelClient, max_calls: int, model_name: str):
        self.llm, self.max_calls, self.model_name = llm, max_calls, model_name

    async def open(self, sandbox: Sandbox, trace: Any = None, model: str | None = None) -> Line:
        from aiohttp import web

        line = Line(f"hb-{secrets.token_urlsafe(24)}", self.llm, self.max_calls, trace, model)
        listener = await sandbox.listen(HARNESS_PORT)

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            return await self._handle(line, request)

        loop = asyncio.get_running_loop()

        def request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY)

        server = web.Server(handle, request_factory=request, access_log=None)
        served = await loop.create_server(server, sock=listener)

        async def stop() -> None:
            served.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.shutdown(timeout=2), 5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(served.wait_closed(), 5)

        line._stop = stop
        return line

    async def _handle(self, line: Line, request: Any) -> Any:
        from aiohttp import web

        path = request.path.rstrip("/").removeprefix("/v1")
        if not line.allowed(request.headers.get("Authorization", "")):
            return _error(web, 401, "this key opens nothing here (each prompt's harness has its own, while it runs)")
        if request.method == "GET" and path == "/models":
            return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                                  "owned_by": "hermes-batch"}]})
        if request.method != "POST" or path != "/chat/completions":
            return _error(web, 404, f"no {request.method} {request.path}: POST /v1/chat/completions")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(web, 400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(web, 400, "the body is not a JSON object")
        if len(line.calls) >= line.max_calls:
            return _error(web, 400, f"this prompt's {line.max_calls} model calls (--max_turns) are spent")
        try:
            call = await line.answer(body)
        except ValueError as exc:
            return _error(web, 400, str(exc))
        if call.reply is None:
            return _error(web, 503 if line.fatal else 502, f"the model could not answer: {call.error}")
        if body.get("stream"):
            return await _streamed(web, request, call.reply, self.model_name,
                                   bool((body.get("stream_options") or {}).get("include_usage")))
        return web.json_response(_completion(call.reply, self.model_name))


def _error(web: Any, status: int, message: str) -> Any:
    kind = "authentication_error" if status == 401 else "invalid_request_error" if status < 500 else "api_error"
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def _message(reply: Completion) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in reply.tool_calls]
    return message


def _finish(reply: Completion) -> str:
    return "tool_calls" if reply.tool_calls else (reply.finish_reason or "stop")


def _usage(reply: Completion) -> dict[str, Any]:
    u = reply.usage or {}
    return {"prompt_tokens": int(u.get("prompt_tokens") or 0), "completion_tokens": int(u.get("completion_tokens") or 0),
            "total_tokens": int(u.get("total_tokens") or 0)}


def _completion(reply: Completion, model: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": _message(reply), "finish_reason": _finish(reply)}],
            "usage": _usage(reply)}


async def _streamed(web: Any, request: Any, reply: Completion, model: str, usage: bool) -> Any:
    """The reply as Chat Completions' server-sent events: the text, each call whole, the finish."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}

    async def send(choices: list[dict[str, Any]], **more: Any) -> None:
        await response.write(f"data: {json.dumps({**head, 'choices': choices, **more})}\n\n".encode())

    opening: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.reasoning:
        opening["reasoning_content"] = reply.reasoning
    await send([{"index": 0, "delta": opening, "finish_reason": None}])
    for i, c in enumerate(reply.tool_calls):
        await send([{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": i, "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}]}}])
    await send([{"index": 0, "delta": {}, "finish_reason": _finish(reply)}])
    if usage:
        await send([], usage=_usage(reply))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
