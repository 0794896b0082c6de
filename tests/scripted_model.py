"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

It speaks real HTTP (aiohttp) so the real `openai` client is exercised end to end. What it says
is decided by the prompt: a prompt may carry `SCRIPT: [turn, ...]` (JSON) where each turn is

    {"calls": [["terminal", {"command": "ls"}], ...]}    tool calls (arguments as a dict, or a raw string)
    {"answer": "text with {last_tool} in it"}             a final answer
    {"answer": ["a", "b"]}                                one of them: the request's `seed` modulo their number
    {"answer": {"model-a": ..., "model-b": ...}}          the one for the request's `model`
    {"reasoning": "...", "finish_reason": "length", ...}  optional extras on either kind
    {"fault": {...}, ...}   the first `times` (default: every) requests of this turn get a fault:
                            {"status": 403, "error": {...}, "headers": {...}} an HTTP error,
                            {"finish_reason": "error"} a 200 whose reply is not an answer,
                            {"no_message": true} a choice without a message,
                            {"malformed": true} a 200 whose body is cut-off JSON

Turn k answers the k-th model request of a conversation. Without a script, the model runs one
`terminal` call (`echo hello-<hash>`) and then answers with what it printed.

`chaos=p` (with `chaos_seed`) gives each request, with probability p, one fault drawn from
CHAOS_KINDS: 429 with and without Retry-After, 500, 503, a reply slower than any sane request
timeout (`chaos_stall` seconds), a dropped connection, a malformed body. `injected` counts them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from typing import Any

from aiohttp import web

_SCRIPT = re.compile(r"SCRIPT:\s*")
MALFORMED = '{"id": "chatcmpl-1", "choices": [{"index": 0, "mess'  # a reply cut off mid-way (a proxy, a crash)
CHAOS_KINDS = ("429_retry_after", "429_bare", "500", "503", "stall", "drop", "malformed")


class ScriptedModel:
    def __init__(
        self,
        *,
        latency: float = 0.0,
        reasoning: str | None = "field",  # "field": a `reasoning` field; "think": <think> in content; None
        api_key: str | None = None,
        rate_limit_first: int = 0,
        retry_after: float = 0.2,
        record_requests: bool = True,
        fail_marker: str | None = None,
        cost_per_token: float | None = None,  # reported as usage.cost, as OpenRouter does
        chaos: float = 0.0,
        chaos_seed: int = 0,
        chaos_stall: float = 5.0,
        grader: Any = None,  # messages → a reply's text, or None: answers what a script cannot (a judge's request)
        prompt_cache: bool = False,  # report cached tokens as a provider with a prompt cache would (below)
    ):
        self.prompt_cache = prompt_cache
        self.grader = grader
        self.chaos = chaos
        self.chaos_random = random.Random(chaos_seed)
        self.chaos_stall = chaos_stall
        self.injected: Counter = Counter()
        self.cost_per_token = cost_per_token
        self.outage = False  # while True, every chat request is answered 503 (an endpoint that is down)
        self.latency = latency
        self.reasoning = reasoning
        self.api_key = api_key
        self.rate_limit_first = rate_limit_first
        self.retry_after = retry_after
        self.record_requests = record_requests
        self.fail_marker = fail_marker  # prompts containing it are refused with HTTP 400
        self.requests: list[dict[str, Any]] = []
        self.attempts: dict[tuple[str, int], int] = {}  # (prompt hash, turn) → requests seen
        self.headers: list[dict[str, str]] = []
        self.served = 0
        self.rate_limited = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # --- behaviour ---------------------------------------------------------------------------
    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages", [])
        prompt = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        turn_no = sum(1 for m in messages if m.get("role") == "assistant")
        last_tool = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "tool"), "")
        graded = self.grader(messages) if self.grader else None
        turn = {"answer": graded, "reasoning": None} if graded is not None else self._turn(prompt, turn_no)
        answer = turn.get("answer", turn.get("content", ""))
        if isinstance(answer, dict):  # by the model asked for (two models compared on one dataset)
            answer = answer.get(body.get("model"), "")
        if isinstance(answer, list):  # one of several, by the request's seed (a sample of several)
            answer = answer[int(body.get("seed") or 0) % len(answer)]
        content = str(answer).replace("{last_tool}", last_tool)
        reasoning = turn.get("reasoning", f"Thinking about step {turn_no + 1}.")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning == "field" and reasoning:
            message["reasoning"] = reasoning
        elif self.reasoning == "think" and reasoning:
            message["content"] = f"<think>{reasoning}</think>{content}"
        calls = []
        for i, (name, args) in enumerate(turn.get("calls", [])):
            calls.append({  # `same_ids`: as endpoints that number each reply's calls from call_0
                "id": f"call_{i}" if turn.get("same_ids") else f"call_{uuid.uuid4().hex[:20]}", "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            })
        if calls:
            message["tool_calls"] = calls
        if turn.get("reasoning_details"):
            message["reasoning_details"] = turn["reasoning_details"]
        finish = turn.get("finish_reason") or ("tool_calls" if calls else "stop")
        prompt_tokens = sum(len(_text(m.get("content"))) for m in messages) // 4 + 10
        completion_tokens = len(content) // 4 + 5 * len(calls) + 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      **({"prompt_tokens_details": {"cached_tokens": self._cached(body)}} if self.prompt_cache else {}),
                      **({"cost": (prompt_tokens + completion_tokens) * self.cost_per_token}
                         if self.cost_per_token else {})},
        }

    @staticmethod
    def _cached(body: dict[str, Any]) -> int:
        """As a provider would serve from its cache, from a conversation's second request on: to an
        Anthropic model, the prefix up to its last breakpoint before the newest message (none without
        breakpoints); to any other model, all but its newest message."""
        messages = body.get("messages", [])
        if not any(m.get("role") == "assistant" for m in messages):
            return 0  # a conversation's first request: nothing of it is in a cache yet
        if "claude" in str(body.get("model", "")).lower():
            marks = [i for i, m in enumerate(messages[:-1]) if isinstance(m.get("content"), list)
                     and any("cache_control" in p for p in m["content"])]
            upto = marks[-1] + 1 if marks else 0
        else:
            upto = len(messages) - 1
        return sum(len(_text(m.get("content"))) for m in messages[:upto]) // 4

    def _fault(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The fault this request gets, if its turn scripts one (called under the lock)."""
        messages = body.get("messages", [])
        prompt = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        turn_no = sum(1 for m in messages if m.get("role") == "assistant")
        fault = self._turn(prompt, turn_no).get("fault")
        if not fault:
            return None
        key = (hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest(), turn_no)
        self.attempts[key] = seen = self.attempts.get(key, 0) + 1
        return fault if seen <= fault.get("times", float("inf")) else None

    @staticmethod
    def _turn(prompt: str, turn_no: int) -> dict[str, Any]:
        script = _script(prompt)
        if script is not None:
            return script[turn_no] if turn_no < len(script) else {"answer": "Done."}
        tag = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        if turn_no == 0:
            return {"calls": [["terminal", {"command": f"echo hello-{tag}"}]]}
        return {"answer": "The command printed: {last_tool}"}

    # --- HTTP --------------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.Response:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Invalid API key", "code": 401}}, status=401)
        body = await request.json()
        chaos = self._chaos()
        if chaos is not None:
            return await self._inject(chaos, request)
        if self.outage:
            return web.json_response({"error": {"message": "upstream unavailable", "code": 503}}, status=503)
        with self._lock:
            if self.record_requests:
                self.requests.append(body)
                self.headers.append(dict(request.headers))
            if self.rate_limited < self.rate_limit_first:
                self.rate_limited += 1
                return web.json_response({"error": {"message": "Rate limit exceeded", "code": 429}}, status=429,
                                         headers={"Retry-After": str(self.retry_after)})
            if self.fail_marker and any(self.fail_marker in str(m.get("content")) for m in body.get("messages", [])):
                return web.json_response({"error": {"message": f"refused: {self.fail_marker}", "code": 400}}, status=400)
            fault = self._fault(body)
            if fault and "status" in fault:
                return web.json_response({"error": fault.get("error", {"message": "scripted fault"})},
                                         status=fault["status"], headers=fault.get("headers"))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            if fault and fault.get("malformed"):
                return web.Response(status=200, text=MALFORMED, content_type="application/json")
            reply = self.reply(body)
            if fault and fault.get("finish_reason"):
                reply["choices"][0]["finish_reason"] = fault["finish_reason"]
            if fault and fault.get("no_message"):
                del reply["choices"][0]["message"]
            if body.get("stream"):
                return await _stream(reply, request)
            return web.json_response(reply)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.served += 1

    def _chaos(self) -> str | None:
        with self._lock:
            if not self.chaos or self.chaos_random.random() >= self.chaos:
                return None
            kind = self.chaos_random.choice(CHAOS_KINDS)
            self.injected[kind] += 1
            return kind

    async def _inject(self, kind: str, request: web.Request) -> web.StreamResponse:
        if kind.startswith("429"):
            headers = {"Retry-After": "0.1"} if kind == "429_retry_after" else None
            return web.json_response({"error": {"message": "Rate limit exceeded", "code": 429}}, status=429,
                                     headers=headers)
        if kind in ("500", "503"):
            return web.json_response({"error": {"message": "upstream error", "code": int(kind)}}, status=int(kind))
        if kind == "stall":
            await asyncio.sleep(self.chaos_stall)
            return web.json_response({"error": {"message": "too late", "code": 504}}, status=504)
        if kind == "drop":
            assert request.transport is not None
            request.transport.close()  # the client sees the connection end with no reply
            return web.Response(status=500)
        return web.Response(status=200, text=MALFORMED, content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Invalid API key", "code": 401}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "tests"}]})

    def start(self, port: int = 0) -> str:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_get("/v1/models", self._models)
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=1024)
            self._loop.run_until_complete(site.start())
            bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.base_url = f"http://127.0.0.1:{bound}/v1"
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True, name="scripted-model")
        self._thread.start()
        ready.wait(10)
        return self.base_url

    def __enter__(self) -> ScriptedModel:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None


def script(*turns: dict[str, Any], text: str = "Scripted task.") -> str:
    """A prompt that makes the scripted model play `turns`."""
    return f"{text}\nSCRIPT: {json.dumps(list(turns))}"


def _script(prompt: str) -> list[dict[str, Any]] | None:
    """The last `SCRIPT: [...]` of a prompt, wherever it stands (a harness may wrap the task in text of its own)."""
    for m in reversed(list(_SCRIPT.finditer(prompt))):
        try:
            script, _ = json.JSONDecoder().raw_decode(prompt, m.end())
        except ValueError:
            continue
        if isinstance(script, list):
            return script
    return None


if __name__ == "__main__":  # a standalone server: python tests/scripted_model.py [port] [latency]
    import sys

    model = ScriptedModel(latency=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0, record_requests=False)
    print(model.start(int(sys.argv[1]) if len(sys.argv) > 1 else 0), flush=True)
    threading.Event().wait()


async def _stream(reply: dict[str, Any], request: web.Request) -> web.StreamResponse:
    """The reply as a server-sent event stream of chat.completion.chunk deltas, as OpenAI streams one
    (clients that always stream: the Hermes Agent asks for `"stream": true` on every request)."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("reasoning"):
        deltas.append({"reasoning": message["reasoning"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                       "function": {"name": call["function"]["name"], "arguments": ""}}]})
        deltas.append({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    chunks.append({**head, "choices": [], "usage": reply["usage"]})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _text(content: Any) -> str:
    """A message's text, whether a string or a list of parts."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")
