"""`--tokens=exact --token_server=vllm`: token ids in and out against a vLLM server.

vLLM renders and tokenises a chat itself (`POST /tokenize` with `messages`: the model's own chat
template and tokenizer) and generates from a token-id prompt (`POST /v1/completions` with
`return_token_ids` and `logprobs`). The first request of a rollout is the chat as vLLM tokenises
it; every later one is the previous request's ids + the reply's ids + the ids vLLM's rendering of
the conversation has after the reply's end-of-turn (found by rendering a turn after the reply,
where the two renderings part): never a re-tokenisation of the history. Where the rendering stops
extending the last one, the rollout starts a new segment. When vLLM leaves the end-of-turn token
out of a reply's ids, the runner puts it back at the start of the next call's ids (among the
runner's, which are not trained on). Log-probabilities are what vLLM reports for the sampled
tokens (its `--logprobs-mode`: raw by default).

vLLM's `/tokenize` reads a special token's text as that token wherever it is, and offers no way to
tokenise text as text: a call whose messages' text holds a chat template's turn token (the export's
check, tokens/controls.py) is refused rather than sent as a forged turn. (SGLang's client renders and
tokenises in the runner, and keeps such text as text.)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx

from ..tokens import TokenTrace, marker
from ..tokens.controls import KIND, held_control
from . import FatalRunError, ModelSettings, PromptFailed
from .token_client import PROBE_CALL, PROBE_TOOL, Generated, TokenClient, finite

PROBE = "hermes-batch tokenizer probe: ✓ 中文 12345 \n\t {\"a\": [1]}"
NEUTRAL = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0}


class VLLMClient(TokenClient):
    server = "vllm"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.end_id, self.context = -1, 0

    async def identify(self) -> tuple[str, str]:
        models = (await self.get("/v1/models")).get("data") or []
        served = [m.get("id") for m in models]
        if self.settings.model not in served:
            raise FatalRunError(f"the {self.server} server at {self.base} serves {', '.join(map(str, served)) or 'no model'}, "
                                f"not --model={self.settings.model}")
        self.context = int(next(m for m in models if m.get("id") == self.settings.model).get("max_model_len") or 0)
        # the end of an assistant turn: the first id the template writes after an empty reply
        opened = await self._chat([{"role": "user", "content": "probe"}], [], True)
        closed = await self._chat([{"role": "user", "content": "probe"}, {"role": "assistant", "content": ""}], [], False)
        if closed[:len(opened)] != opened or len(closed) <= len(opened):
            raise FatalRunError(f"the chat template of the {self.server} server at {self.base} does not close an "
                                "assistant turn after opening it: --tokens=exact cannot tell where a reply ends")
        self.end_id = closed[len(opened)]
        if "<tool_call>" not in await self._detokenize(await self._chat(PROBE_CALL, [PROBE_TOOL], False)):
            raise FatalRunError(f"the chat template of the {self.server} server at {self.base} does not write tool "
                                "calls in the Hermes/Qwen <tool_call> format, the one --tokens=exact reads")
        vocabulary = hashlib.sha256(json.dumps([self.settings.model, await self._probe()]).encode()).hexdigest()[:16]
        template = hashlib.sha256(json.dumps([opened, closed]).encode()).hexdigest()[:16]
        return vocabulary, template

    async def _detokenize(self, ids: list[int]) -> str:
        return str((await self.post("/detokenize", {"model": self.settings.model, "tokens": ids})).get("prompt") or "")

    async def _probe(self) -> list[int]:
        """The ids of a fixed text: with the model's name, they name the vocabulary."""
        return [int(t) for t in (await self.post("/tokenize", {"model": self.settings.model, "prompt": PROBE,
                                                               "add_special_tokens": False}))["tokens"]]

    async def prompt(self, trace: TokenTrace, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> tuple[int, list[int]]:
        full = await self._chat(messages, tools, True)
        last = trace.calls[-1] if trace.calls else None
        try:
            if last is not None and last.finish_reason != "length" and full[:len(trace.rendered_ids)] == trace.rendered_ids:
                upto = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
                probe = await self._chat([*messages[:upto + 1], {"role": "user", "content": marker()}], tools, False)
                parted = next((i for i, (a, b) in enumerate(zip(probe, full, strict=False)) if a != b),
                              min(len(probe), len(full)))
                turn = full[len(trace.rendered_ids):parted]  # the reply as the template writes it, and what follows
                if self.end_id in turn:
                    close = len(trace.rendered_ids) + len(turn) - 1 - turn[::-1].index(self.end_id)
                    ended = (last.completion or [])[-1:] == [self.end_id]
                    self._check_text(messages[upto + 1:])
                    return last.segment, full[close + 1:] if ended else full[close:]
            self._check_text(messages)
            return (last.segment + 1 if last else 0), full
        finally:
            trace.rendered_ids = full

    def _check_text(self, messages: list[dict[str, Any]]) -> None:
        """PromptFailed where the text of the messages whose ids this call adds holds a turn token:
        vLLM's /tokenize would make it one (the runner's own rendering keeps it text)."""
        if not self.plain_text and (found := held_control(messages)):
            raise PromptFailed(KIND, f"a {found[0]} message's text holds the control token {found[1]}, which vLLM's "
                                     "/tokenize makes a turn token (it tokenises no text as text): refused rather than "
                                     "sent as a forged turn")

    async def generate(self, prompt: list[int], seed: int | None, model: str | None = None) -> Generated:
        body: dict[str, Any] = {"model": model or self.settings.model, "prompt": prompt, "temperature": self.temperature,
                                **NEUTRAL, "logprobs": 1, "return_token_ids": True}
        # vLLM's own default is 16 tokens: what is left of the context, unless --max_tokens says less
        left = self.context - len(prompt) if self.context else 4096
        body["max_tokens"] = min(self.settings.max_tokens, left) if self.settings.max_tokens else left
        if seed is not None:
            body["seed"] = seed
        answer = await self.post("/v1/completions", body)
        choice = (answer.get("choices") or [{}])[0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        if choice.get("token_ids") is None:
            raise FatalRunError(f"the vLLM server at {self.base} returned no token_ids: --tokens=exact needs a vLLM "
                                "that takes return_token_ids (0.10.2 or later)")
        given = (choice.get("logprobs") or {}).get("token_logprobs") or []
        logprobs = [finite(given[i]) if i < len(given) else float("nan") for i in range(len(ids))]
        usage = answer.get("usage") or {}
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        return Generated(ids, logprobs, str(choice.get("text") or ""), choice.get("finish_reason") == "length",
                         int(cached))

    async def _chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> list[int]:
        body: dict[str, Any] = {"model": self.settings.model, "messages": messages,
                                "add_generation_prompt": generation, "add_special_tokens": False}
        if tools:
            body["tools"] = tools
        return [int(t) for t in (await self.post("/tokenize", body))["tokens"]]

    @staticmethod
    async def check(settings: ModelSettings, api_key: str | None) -> str | None:
        base = settings.base_url.rstrip("/").removesuffix("/v1")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            async with httpx.AsyncClient(timeout=20, trust_env=False, headers=headers) as http:
                res = await http.get(f"{base}/v1/models")
        except httpx.TransportError as exc:
            raise FatalRunError(f"cannot reach the vLLM server {base} ({type(exc).__name__}: {exc})") from exc
        if res.status_code == 401:
            raise FatalRunError(f"the vLLM server at {base} rejected the API key")
        return None
