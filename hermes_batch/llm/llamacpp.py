"""`--tokens=exact` against llama.cpp's own server (the embedded model's, or one of your own at
--base_url): token ids in, token ids and log-probabilities out, nothing re-tokenised.

The first request of a rollout is the chat rendered by the server's own template (`/apply-template`)
and tokenised by its own vocabulary (`/tokenize`); its reply comes back from `/completion` as ids.
Every later request is the previous request's ids + the reply's ids + the ids of what the template
writes after that reply (tool results, the next turn's opening), never a re-rendering of the
history. When the template stops being an extension of what was sent (it re-renders an earlier
turn), or a reply was cut before its end-of-turn token, the rollout starts a new segment: its
prompt rendered and tokenised afresh. Tool calls are read from the reply's text client-side
(tokens.FORMATS: hermes).

Sampling is the policy's: the server's own sampler defaults (top-k 40, top-p, min-p, DRY, repeat
penalty) are switched off, `--temperature` (1.0 by default) is the one setting, and each token's
log-probability is of the distribution it was drawn from (after temperature). No grammar is applied
(a forced tool call is not the policy's sample), so `--first_tool_choice` has no effect here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from typing import Any

import httpx

from ..tokens import FORMATS, TokenCall, TokenTrace
from ..util import AdaptiveLimit
from . import Completion, FatalRunError, ModelSettings, PromptFailed

PROBE = "hermes-batch tokenizer probe: <|im_start|> ✓ 中文 12345 \n\t {\"a\": [1]}"  # its ids name the vocabulary
SENTINEL = "\u2063hermes-batch: the turn after\u2063"  # a user turn rendered after a reply, to find where the reply ends
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "a probe",
                                                "parameters": {"type": "object", "properties": {}}}}
NEUTRAL = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0}


class LlamaCppClient:
    def __init__(self, settings: ModelSettings, api_key: str | None, limit: AdaptiveLimit):
        self.settings, self.limit = settings, limit
        self.base = settings.base_url.rstrip("/").removesuffix("/v1")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(timeout=settings.request_timeout, headers=headers, trust_env=False)
        self.parse = FORMATS["hermes"]
        self._identity: tuple[str, str, str, int] | None = None  # tokenizer hash, template hash, end text, end id
        self._identified = asyncio.Lock()

    async def close(self) -> None:
        await self.http.aclose()

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       tool_choice: str | None = None, seed: int | None = None,
                       trace: TokenTrace | None = None) -> Completion:
        trace = trace if trace is not None else TokenTrace()
        tokenizer, template, end_text, end_id = await self._identify()
        trace.tokenizer, trace.template = tokenizer, template
        started = time.monotonic()
        rendered = await self._render(messages, tools, True)
        segment, added = await self._added(trace, messages, tools, rendered, end_text, end_id)
        trace.render_seconds += time.monotonic() - started
        prompt = (trace.sequence() if segment == trace.segments - 1 else []) + added
        body: dict[str, Any] = {"prompt": prompt, "n_predict": self.settings.max_tokens or -1,
                                "temperature": 1.0 if self.settings.temperature is None else self.settings.temperature,
                                **NEUTRAL, "return_tokens": True, "n_probs": 1, "post_sampling_probs": True,
                                "cache_prompt": True, "speculative.n_max": 0}  # a draft model's tokens come without probabilities
        if seed is not None:
            body["seed"] = seed
        async with self.limit:
            reply = await self._post("/completion", body)
        self.limit.succeeded()
        if reply.get("truncated"):  # the server dropped part of the prompt to fit its context: no longer what was sent
            raise PromptFailed("bad_request", "the llama.cpp server cut the prompt to fit its context (--tokens=exact "
                                              "keeps only what was sent): give it a larger context")
        completion = [int(t) for t in reply.get("tokens") or []]
        logprobs = _aligned(completion, reply.get("completion_probabilities") or [])
        offered = {t["function"]["name"] for t in tools}
        content, reasoning, calls = self.parse(str(reply.get("content") or ""), offered)
        finish = "length" if reply.get("stop_type") == "limit" else ("tool_calls" if calls else "stop")
        trace.calls.append(TokenCall(segment, added, completion, logprobs, finish))
        trace.rendered = rendered
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                 "total_tokens": len(prompt) + len(completion),
                 "cached_tokens": int((reply.get("timings") or {}).get("cache_n") or 0)}
        return Completion(content=content, reasoning=reasoning, tool_calls=calls, finish_reason=finish, usage=usage,
                          latency=time.monotonic() - started)

    async def _added(self, trace: TokenTrace, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     rendered: str, end_text: str, end_id: int) -> tuple[int, list[int]]:
        """(the segment of this call, the ids it adds): what the template writes after the last reply's
        end-of-turn (tool results, the next turn's opening), or the whole prompt of a new segment."""
        last = trace.calls[-1] if trace.calls else None
        if last is not None and last.completion[-1:] == [end_id] and rendered.startswith(trace.rendered):
            # where the template closes the reply: the last end-of-turn before a turn rendered after it
            # (the reply's own text may hold the end-of-turn's letters); the model's own ids stand for the reply
            upto = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            probe = await self._render([*messages[:upto + 1], {"role": "user", "content": SENTINEL}], tools, False)
            mark = probe.find(SENTINEL)
            end = probe.rfind(end_text, len(trace.rendered), mark) if mark > 0 else -1
            if end >= 0 and rendered.startswith(probe[:end + len(end_text)]):
                return last.segment, await self._tokenize(rendered[end + len(end_text):])
        return (last.segment + 1 if last else 0), await self._tokenize(rendered, start=True)

    async def _identify(self) -> tuple[str, str, str, int]:
        async with self._identified:
            if self._identity is None:
                props = await self._get("/props")
                end_text = str(props.get("eos_token") or "")
                end = await self._tokenize(end_text) if end_text else []
                if len(end) != 1:
                    raise FatalRunError(f"the llama.cpp server at {self.base} names no single end-of-turn token "
                                        f"({end_text!r}): --tokens=exact cannot tell where a reply ends")
                probe = await self._tokenize(PROBE)
                vocabulary = hashlib.sha256(json.dumps([props.get("model_path", "").rsplit("/", 1)[-1], probe])
                                            .encode()).hexdigest()[:16]
                template = hashlib.sha256(str(props.get("chat_template") or "").encode()).hexdigest()[:16]
                call = {"id": "c1", "type": "function", "function": {"name": "probe_tool", "arguments": "{}"}}
                shown = await self._render([{"role": "user", "content": "probe"},
                                            {"role": "assistant", "content": "", "tool_calls": [call]}],
                                           [_PROBE_TOOL], False)
                if "<tool_call>" not in shown:
                    raise FatalRunError(f"the chat template of the llama.cpp server at {self.base} does not write tool "
                                        "calls in the Hermes/Qwen <tool_call> format, the one --tokens=exact reads")
                self._identity = (vocabulary, template, end_text, end[0])
            return self._identity

    async def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> str:
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": generation}
        if tools:
            body["tools"] = tools
        return str((await self._post("/apply-template", body))["prompt"])

    async def _tokenize(self, text: str, start: bool = False) -> list[int]:
        """`start`: the beginning of a sequence, with the BOS token a vocabulary adds there (the server's
        template leaves it out when it does)."""
        answer = await self._post("/tokenize", {"content": text, "add_special": start, "parse_special": True})
        return [int(t) for t in answer["tokens"]]

    async def _get(self, path: str) -> dict[str, Any]:
        return await self._request("GET", path, None)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
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
                raise FatalRunError(f"the llama.cpp server at {self.base} rejected the API key")
            if res.status_code == 404:
                raise FatalRunError(f"the server at {self.base} has no {path}: --tokens=exact needs llama.cpp's own "
                                    "server (its native endpoints)")
            if 400 <= res.status_code < 500:
                raise PromptFailed("bad_request", f"the llama.cpp server refused {path}: HTTP {res.status_code}: "
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

    @staticmethod
    async def check(settings: ModelSettings, api_key: str | None) -> str | None:
        base = settings.base_url.rstrip("/").removesuffix("/v1")
        try:
            async with httpx.AsyncClient(timeout=20, trust_env=False) as http:
                res = await http.get(f"{base}/props")
        except httpx.TransportError as exc:
            raise FatalRunError(f"cannot reach the llama.cpp server {base} ({type(exc).__name__}: {exc})") from exc
        if res.status_code == 404:
            raise FatalRunError(f"{base} has no /props: --tokens=exact needs llama.cpp's own server")
        return None


def _aligned(ids: list[int], probabilities: list[dict[str, Any]]) -> list[float]:
    """One log-probability per id, matched by id in order (llama.cpp leaves out a token that ends
    inside an incomplete UTF-8 character): NaN where none came."""
    out, j = [], 0
    for token in ids:
        if j < len(probabilities) and probabilities[j].get("id") == token:
            entry = probabilities[j]
            j += 1
            if isinstance(entry.get("logprob"), (int, float)):
                out.append(float(entry["logprob"]))
            elif isinstance(entry.get("prob"), (int, float)):
                p = float(entry["prob"])
                out.append(math.log(p) if p > 0 else math.nan)
            else:
                out.append(math.nan)
        else:
            out.append(math.nan)
    return out
