"""What every token-in, token-out endpoint shares under `--tokens=exact` (llamacpp.py, vllm.py): one
model call is the prompt's ids (`prompt`: the whole prompt at a segment's start, else the ids the
template writes after the last reply), then the server's completion ids and their log-probabilities
(`generate`); the call is added to the rollout's `TokenTrace`, and its tool calls are read from the
reply's text client-side (tokens.FORMATS: hermes). An endpoint's own file says how it renders,
tokenises and generates; retries and the shape of a Completion live here once."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..tokens import FORMATS, TokenCall, TokenTrace
from ..util import AdaptiveLimit
from . import Completion, FatalRunError, ModelSettings, PromptFailed

PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "a probe",
                                               "parameters": {"type": "object", "properties": {}}}}
PROBE_CALL: list[dict[str, Any]] = [{"role": "user", "content": "probe"},
                                   {"role": "assistant", "content": "", "tool_calls": [
                                       {"id": "c1", "type": "function", "function": {"name": "probe_tool", "arguments": "{}"}}]}]


@dataclass
class Generated:
    ids: list[int]  # the completion's ids, its end-of-turn token included when it has one
    logprobs: list[float]  # one per id; NaN where the server gave none
    text: str  # the completion's text, its end-of-turn token left out
    cut: bool  # stopped by the token limit
    cached: int = 0  # prompt tokens the server had cached


class TokenClient:
    server = "?"  # what the messages call the server
    plain_text = False  # every message's text is tokenised as text, each call's control ids checked (tokens/controls.py)

    def __init__(self, settings: ModelSettings, api_key: str | None, limit: AdaptiveLimit):
        self.settings, self.limit = settings, limit
        self.base = settings.base_url.rstrip("/").removesuffix("/v1")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(timeout=settings.request_timeout, headers=headers, trust_env=False)
        self.parse = FORMATS["hermes"]
        self._identity: tuple[str, str] | None = None  # tokenizer hash, template hash
        self._identified = asyncio.Lock()

    @property
    def temperature(self) -> float:
        return sampling_temperature(self.settings.temperature)

    async def close(self) -> None:
        await self.http.aclose()

    async def identify(self) -> tuple[str, str]:
        """(a hash naming the vocabulary, a hash naming the chat template); FatalRunError when the
        server cannot serve token-exact Hermes-format rollouts."""
        raise NotImplementedError

    async def prompt(self, trace: TokenTrace, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> tuple[int, list[int]]:
        """(this call's segment, the ids it adds to the sequence)."""
        raise NotImplementedError

    async def generate(self, prompt: list[int], seed: int | None, model: str | None = None) -> Generated:
        """`model`: the served model to ask, where the server serves several (None: the run's)."""
        raise NotImplementedError

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       tool_choice: str | None = None, seed: int | None = None,
                       trace: TokenTrace | None = None, model: str | None = None) -> Completion:
        trace = trace if trace is not None else TokenTrace()
        async with self._identified:
            if self._identity is None:
                self._identity = await self.identify()
        trace.tokenizer, trace.template = self._identity
        started = time.monotonic()
        segment, added = await self.prompt(trace, messages, tools)
        trace.plain_text = self.plain_text and (trace.plain_text or not trace.calls)
        trace.render_seconds += time.monotonic() - started
        prompt = ((trace.sequence() or []) if segment == trace.segments - 1 else []) + added  # exact: all known
        async with self.limit:
            got = await self.generate(prompt, seed, model)
        self.limit.succeeded()
        content, reasoning, calls = self.parse(got.text, {t["function"]["name"] for t in tools})
        finish = "length" if got.cut else ("tool_calls" if calls else "stop")
        trace.calls.append(TokenCall(segment, added, got.ids, got.logprobs, finish))
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(got.ids),
                 "total_tokens": len(prompt) + len(got.ids), "cached_tokens": got.cached}
        return Completion(content=content, reasoning=reasoning, tool_calls=calls, finish_reason=finish, usage=usage,
                          latency=time.monotonic() - started)

    async def get(self, path: str) -> dict[str, Any]:
        return await self._request("GET", path, None)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", path, body)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        failures = 0
        while True:
            try:
                res = await self.http.request(method, self.base + path, json=body)
            except httpx.TransportError as exc:  # a restarting server, a dropped connection
                failures += 1
                if failures > self.settings.max_retries:
                    raise PromptFailed("endpoint_unreachable", f"cannot reach {self.base}{path}: "
                                                               f"{type(exc).__name__}: {exc} (after {failures} tries)") from exc
                await asyncio.sleep(min(30.0, 2 ** failures) / 2)
                continue
            if res.status_code == 401:
                raise FatalRunError(f"the {self.server} server at {self.base} rejected the API key")
            if res.status_code == 404:
                raise FatalRunError(f"the server at {self.base} has no {path}: --tokens=exact with "
                                    f"--token_server={self.server} needs {self.server}'s own endpoints")
            if 400 <= res.status_code < 500:
                raise PromptFailed("bad_request", f"the {self.server} server refused {path}: HTTP {res.status_code}: "
                                                  f"{res.text[:300]}")
            if res.status_code >= 500:
                failures += 1
                if failures > self.settings.max_retries:
                    raise PromptFailed("server_error", f"{path}: HTTP {res.status_code}: {res.text[:300]} "
                                                       f"(after {failures} tries)")
                await asyncio.sleep(min(30.0, 2 ** failures) / 2)
                continue
            try:
                answer = res.json()
            except ValueError:
                raise PromptFailed("bad_response", f"{path} answered with something other than JSON") from None
            if not isinstance(answer, dict):
                raise PromptFailed("bad_response", f"{path} answered {str(answer)[:100]}")
            return answer


def sampling_temperature(temperature: float | None) -> float:
    """What a token server samples at: the run's --temperature, else the policy's own (1.0), never a
    server's default (which differs between servers)."""
    return 1.0 if temperature is None else temperature


def finite(value: Any) -> float:
    """A log-probability as a server wrote it: NaN for none (null, a string, an infinity)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan
