"""The interception endpoint: what a harness running inside a prompt's sandbox takes for its model.

The runner serves it into each such sandbox alone, on the sandbox's own loopback at `BASE_URL`
(a listening socket placed in the sandbox's network: backends/egress.py), and answers every call
through the run's own model client: the run's model, sampling and `--max_tokens` whatever the
harness asks (what it asked is kept), its limits and retries, and with `--tokens=exact` the
prompt's token trace. Each prompt's harness has a key of its own, good for its own sandbox's
endpoint and only while its prompt runs; the run's API keys never enter a sandbox. Every call is
kept (`Line.calls`): the record is rebuilt from them (transcript.py).

It speaks OpenAI Chat Completions (`POST /v1/chat/completions`), Anthropic's Messages API
(`POST /v1/messages`, messages_api.py) and OpenAI's Responses API (`POST /v1/responses`,
responses_api.py), each streamed as server-sent events or not, every call kept in Chat Completions'
terms; it lists the run's model (`GET /v1/models`). A key is read from `Authorization: Bearer` (the
OpenAI clients) or `x-api-key` (the Anthropic ones)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..backends import Sandbox
from ..llm import Completion, FatalRunError, ModelClient, PromptFailed
from ..tools.base import Image
from . import messages_api, responses_api
from .wire import Ask, Refused, event

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
    images: dict[str, tuple[Image, ...]] = field(default_factory=dict)  # its tool results', by call id (wire.Ask)
    traced: int | None = None  # its place in the prompt's token trace (--tokens=exact), where it has one


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
    # one call at a time on the prompt's token trace: each call's ids extend the last call's, so two
    # at once (a side call beside a turn) would be rendered against each other's history
    _traced: asyncio.Lock = field(default_factory=asyncio.Lock)
    _seen: dict[Any, Any] = field(default_factory=dict)  # its images, and their data: URLs, once each

    def _shared(self, ask: Ask) -> None:
        """Each image of the prompt once in memory, however many of its calls send it again (a
        harness sends its whole history each time, and every call is kept)."""
        for cid, images in ask.images.items():
            ask.images[cid] = tuple(self._seen.setdefault(i, i) for i in images)
        for m in ask.messages:
            parts = m.get("content") if m.get("role") == "user" else None
            for part in parts if isinstance(parts, list) else ():
                url = part.get("image_url") if isinstance(part, dict) else None
                if isinstance(url, dict) and isinstance(url.get("url"), str):
                    url["url"] = self._seen.setdefault(url["url"], url["url"])

    def allowed(self, given: str) -> bool:
        return self.open and hmac.compare_digest(given.encode(), self.key.encode())

    async def answer(self, ask: Ask) -> Call:
        self._as_written(ask.messages)
        self._shared(ask)
        call = Call(ask.messages, ask.tools, ask.asked, images=ask.images)
        self.calls.append(call)
        started = time.monotonic()
        try:
            async with self._traced if self.trace is not None else contextlib.nullcontext():
                before = len(self.trace.calls) if self.trace is not None else 0
                call.reply = await self.llm.complete(ask.messages, ask.tools, ask.tool_choice, trace=self.trace,
                                                     model=self.model)
                if self.trace is not None and len(self.trace.calls) > before:
                    call.traced = before
        except PromptFailed as exc:
            call.error = f"{exc.kind}: {exc}"
        except FatalRunError as exc:
            self.fatal = exc
            call.error = str(exc)
        call.seconds = time.monotonic() - started
        return call

    def _as_written(self, messages: list[dict[str, Any]]) -> None:
        """A tool call of the model's sent back as an object (the Messages API's `input`) in the
        arguments text the model wrote, where they are the same JSON: the history is what the model
        saw, token for token (--tokens=exact)."""
        written = {c["id"]: c["arguments"] for call in self.calls if call.reply for c in call.reply.tool_calls}
        for m in messages:
            for c in m.get("tool_calls") or []:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or (text := written.get(c.get("id"))) is None:
                    continue
                if text != fn.get("arguments") and _same_json(text, fn.get("arguments")):
                    fn["arguments"] = text

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
        api = API.get(path) or API["/messages" if path.startswith("/messages") else "/chat/completions"]
        given = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not line.allowed(given.strip()):
            return _error(web, api, 401, "this key opens nothing here (each prompt's harness has its own, while it runs)")
        if request.method == "GET" and path == "/models":
            return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                                  "owned_by": "hermes-batch"}]})
        if request.method != "POST" or (path not in API and path != "/messages/count_tokens"):
            return _error(web, api, 404, f"no {request.method} {request.path}: POST /v1/chat/completions, "
                                         "/v1/messages or /v1/responses")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(web, api, 400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(web, api, 400, "the body is not a JSON object")
        if path == "/messages/count_tokens":
            return web.json_response(messages_api.count_tokens(body))
        if len(line.calls) >= line.max_calls:
            return _error(web, api, 400, f"this prompt's {line.max_calls} model calls (--max_turns) are spent")
        try:
            ask = api.ask(body)
        except Refused as exc:
            return _error(web, api, 400, str(exc))
        if ask.images and line.trace is not None:  # as --vision_model=main is refused with it
            return _error(web, api, 400, "--tokens=exact sends the model token ids only: the images of tool results "
                                         "cannot be shown to it")
        call = await line.answer(ask)
        if call.reply is None:
            return _error(web, api, 503 if line.fatal else 502, f"the model could not answer: {call.error}")
        if not ask.stream:
            return web.json_response(api.reply(call.reply, self.model_name, body))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        async for chunk in api.stream(call.reply, self.model_name, body):
            await response.write(chunk)
        await response.write_eof()
        return response


@dataclass(frozen=True)
class _Api:
    """One API the endpoint speaks: its request as a Chat Completions call, its reply, its stream, its errors."""

    ask: Callable[[dict[str, Any]], Ask]
    reply: Callable[[Completion, str, dict[str, Any]], dict[str, Any]]
    stream: Callable[[Completion, str, dict[str, Any]], AsyncIterator[bytes]]
    error: Callable[[int, str], dict[str, Any]]


def _same_json(a: Any, b: Any) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except (TypeError, ValueError):
        return False


def _error(web: Any, api: _Api, status: int, message: str) -> Any:
    return web.json_response(api.error(status, message), status=status)


def _ask(body: dict[str, Any]) -> Ask:
    """A Chat Completions request, as the run's model client takes it."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused("`messages` must be a non-empty list")
    tools = body.get("tools") or []
    tool_choice = body.get("tool_choice")
    return Ask(messages, tools if isinstance(tools, list) else [], tool_choice if tool_choice != "auto" else None,
               {k: body[k] for k in OVERRIDDEN if k in body}, bool(body.get("stream")))


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


def _completion(reply: Completion, model: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": _message(reply), "finish_reason": _finish(reply)}],
            "usage": _usage(reply)}


async def _streamed(reply: Completion, model: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """The reply as Chat Completions' server-sent events: the text, each call whole, the finish."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}

    def send(choices: list[dict[str, Any]], **more: Any) -> bytes:
        return event(None, {**head, "choices": choices, **more})

    opening: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.reasoning:
        opening["reasoning_content"] = reply.reasoning
    yield send([{"index": 0, "delta": opening, "finish_reason": None}])
    for i, c in enumerate(reply.tool_calls):
        yield send([{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": i, "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}]}}])
    yield send([{"index": 0, "delta": {}, "finish_reason": _finish(reply)}])
    if (body.get("stream_options") or {}).get("include_usage"):
        yield send([], usage=_usage(reply))
    yield b"data: [DONE]\n\n"


def _chat_error(status: int, message: str) -> dict[str, Any]:
    kind = "authentication_error" if status == 401 else "invalid_request_error" if status < 500 else "api_error"
    return {"error": {"message": message, "type": kind}}


API = {"/chat/completions": _Api(_ask, _completion, _streamed, _chat_error),
       "/messages": _Api(messages_api.ask, messages_api.reply, messages_api.stream, messages_api.error),
       "/responses": _Api(responses_api.ask, responses_api.reply, responses_api.stream, responses_api.error)}
