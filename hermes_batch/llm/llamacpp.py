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

import hashlib
import json
import math
from typing import Any

import httpx

from ..tokens import TokenTrace
from . import FatalRunError, ModelSettings, PromptFailed
from .token_client import PROBE_CALL, PROBE_TOOL, SENTINEL, Generated, TokenClient, finite

PROBE = "hermes-batch tokenizer probe: <|im_start|> ✓ 中文 12345 \n\t {\"a\": [1]}"  # its ids name the vocabulary
NEUTRAL = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0}


class LlamaCppClient(TokenClient):
    server = "llamacpp"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.end_text, self.end_id = "", -1

    async def identify(self) -> tuple[str, str]:
        props = await self.get("/props")
        self.end_text = str(props.get("eos_token") or "")
        end = await self._tokenize(self.end_text) if self.end_text else []
        if len(end) != 1:
            raise FatalRunError(f"the llama.cpp server at {self.base} names no single end-of-turn token "
                                f"({self.end_text!r}): --tokens=exact cannot tell where a reply ends")
        self.end_id = end[0]
        probe = await self._tokenize(PROBE)
        vocabulary = hashlib.sha256(json.dumps([props.get("model_path", "").rsplit("/", 1)[-1], probe])
                                    .encode()).hexdigest()[:16]
        template = hashlib.sha256(str(props.get("chat_template") or "").encode()).hexdigest()[:16]
        if "<tool_call>" not in await self._render(PROBE_CALL, [PROBE_TOOL], False):
            raise FatalRunError(f"the chat template of the llama.cpp server at {self.base} does not write tool "
                                "calls in the Hermes/Qwen <tool_call> format, the one --tokens=exact reads")
        return vocabulary, template

    async def prompt(self, trace: TokenTrace, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> tuple[int, list[int]]:
        """What the template writes after the last reply's end-of-turn (tool results, the next
        turn's opening), or the whole prompt of a new segment."""
        rendered = await self._render(messages, tools, True)
        last = trace.calls[-1] if trace.calls else None
        try:
            if last is not None and (last.completion or [])[-1:] == [self.end_id] and rendered.startswith(trace.rendered):
                # where the template closes the reply: the last end-of-turn before a turn rendered after it
                # (the reply's own text may hold the end-of-turn's letters); the model's own ids stand for the reply
                upto = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
                probe = await self._render([*messages[:upto + 1], {"role": "user", "content": SENTINEL}], tools, False)
                mark = probe.find(SENTINEL)
                end = probe.rfind(self.end_text, len(trace.rendered), mark) if mark > 0 else -1
                if end >= 0 and rendered.startswith(probe[:end + len(self.end_text)]):
                    return last.segment, await self._tokenize(rendered[end + len(self.end_text):])
            return (last.segment + 1 if last else 0), await self._tokenize(rendered, start=True)
        finally:
            trace.rendered = rendered

    async def generate(self, prompt: list[int], seed: int | None, model: str | None = None) -> Generated:
        # one model per server: `model` names the weights it serves (a trainer's version), which it does not read
        body: dict[str, Any] = {"prompt": prompt, "n_predict": self.settings.max_tokens or -1,
                                "temperature": self.temperature, **NEUTRAL, "return_tokens": True, "n_probs": 1,
                                "post_sampling_probs": True, "cache_prompt": True,
                                "speculative.n_max": 0}  # a draft model's tokens come without probabilities
        if seed is not None:
            body["seed"] = seed
        reply = await self.post("/completion", body)
        if reply.get("truncated"):  # the server dropped part of the prompt to fit its context: no longer what was sent
            raise PromptFailed("bad_request", "the llama.cpp server cut the prompt to fit its context (--tokens=exact "
                                              "keeps only what was sent): give it a larger context")
        ids = [int(t) for t in reply.get("tokens") or []]
        return Generated(ids, _aligned(ids, reply.get("completion_probabilities") or []), str(reply.get("content") or ""),
                         reply.get("stop_type") == "limit", int((reply.get("timings") or {}).get("cache_n") or 0))

    async def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> str:
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": generation}
        if tools:
            body["tools"] = tools
        return str((await self.post("/apply-template", body))["prompt"])

    async def _tokenize(self, text: str, start: bool = False) -> list[int]:
        """`start`: the beginning of a sequence, with the BOS token a vocabulary adds there (the server's
        template leaves it out when it does)."""
        answer = await self.post("/tokenize", {"content": text, "add_special": start, "parse_special": True})
        return [int(t) for t in answer["tokens"]]

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
            if "logprob" in entry:
                out.append(finite(entry["logprob"]))
            else:
                p = finite(entry.get("prob"))
                out.append(math.log(p) if p > 0 else math.nan)
        else:
            out.append(math.nan)
    return out
