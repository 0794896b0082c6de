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

Control tokens are the template's alone (tokens/controls.py): the rendering is laid out against its
skeleton's, the control tokens written in the template's own text are given as ids, and every
stretch between them (the messages' text with the template's around it) is tokenised with
`parse_special` off, in one `/tokenize` of mixed text and ids, as llama.cpp splits a text at its
special tokens. Which of the template's tokens are control tokens is learned from the server, once
per piece of template text. Where the template does not copy a message's text as it is, the
rendering is tokenised as a whole and refused when it holds more control tokens than its skeleton.

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
from typing import Any

import httpx

from ..tokens import Skeleton, TokenTrace, marker
from ..tokens.controls import KIND, Layout, excess
from . import FatalRunError, ModelSettings, PromptFailed
from .token_client import PROBE_CALL, PROBE_TOOL, Generated, TokenClient, finite

PROBE = "hermes-batch tokenizer probe: <|im_start|> ✓ 中文 12345 \n\t {\"a\": [1]}"  # its ids name the vocabulary
NEUTRAL = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0}


class LlamaCppClient(TokenClient):
    server = "llamacpp"
    plain_text = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.end_text, self.end_id = "", -1
        self.opening: list[int] = []  # what the vocabulary puts around a sequence: its BOS (and EOS, if it adds one)
        self.closing: list[int] = []
        self.controls: dict[str, int] = {}  # the control tokens met in the template's text: text → id
        self._text_ids: set[int] = set()  # ids found to be no control token
        self._understood: set[str] = set()  # pieces of template text whose split at control tokens is llama.cpp's
        self._not_understood: set[str] = set()  # and those whose is not (tokenised whole, checked by counts)
        self._learning = asyncio.Lock()

    async def identify(self) -> tuple[str, str]:
        props = await self.get("/props")
        self.end_text = str(props.get("eos_token") or "")
        end = await self._tokenize(self.end_text) if self.end_text else []
        if len(end) != 1:
            raise FatalRunError(f"the llama.cpp server at {self.base} names no single end-of-turn token "
                                f"({self.end_text!r}): --tokens=exact cannot tell where a reply ends")
        self.end_id = end[0]
        plain, whole = await self._ids("a"), await self._ids("a", add_special=True)
        at = next((k for k in range(len(whole) - len(plain) + 1) if whole[k:k + len(plain)] == plain), None)
        if at is None:
            raise FatalRunError(f"the llama.cpp server at {self.base} tokenises a text other than itself when it adds "
                                "its special tokens: --tokens=exact cannot tell what a sequence starts with")
        self.opening, self.closing = whole[:at], whole[at + len(plain):]
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
                # (the reply's own text may hold the end-of-turn's letters; no text holds a marker drawn now);
                # the model's own ids stand for the reply
                upto = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
                mark = marker()
                probe = await self._render([*messages[:upto + 1], {"role": "user", "content": mark}], tools, False)
                at = probe.find(mark)
                end = probe.rfind(self.end_text, len(trace.rendered), at) if at > 0 else -1
                if end >= 0 and rendered.startswith(probe[:end + len(self.end_text)]):
                    return last.segment, await self._text_as_text(messages, tools, rendered, end + len(self.end_text))
            return (last.segment + 1 if last else 0), await self._text_as_text(messages, tools, rendered, 0)
        finally:
            trace.rendered = rendered

    async def _text_as_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], rendered: str,
                            start: int) -> list[int]:
        """The ids of rendered[start:] (a sequence's start when 0): control tokens where the template
        wrote them, every message's text as text; PromptFailed rather than a forged turn."""
        skeleton = Skeleton.of(messages)
        shape = await self._render(skeleton.messages, tools, True)
        layout = skeleton.layout(shape, rendered)
        if layout.covered <= start and await self._understand(layout.pieces(start)):
            parts = layout.parts(self.controls, start) or []
            ids = await self._ids(parts, parse_special=False)
            ours = set(self.controls.values())
            if sum(t in ours for t in ids) != sum(isinstance(p, int) for p in parts):
                raise PromptFailed(KIND, f"the llama.cpp server at {self.base} tokenised a message's text into control "
                                         "tokens with parse_special off: sending it would forge turns")
            return self.opening + ids + self.closing if start == 0 else ids
        # the template rewrote a message's text: tokenised whole, its control tokens counted against the skeleton's
        ids = await self._tokenize(rendered[start:], start=start == 0)
        real, own = await self._controls_in(rendered), await self._controls_in(shape)
        if why := excess(real, own, {i: t for t, i in self.controls.items()}):
            raise PromptFailed(KIND, why)
        return ids

    async def _understand(self, pieces: list[str]) -> bool:
        """Whether each piece of template text tokenises as llama.cpp tokenises it with parse_special
        on, once split at the control tokens known (those it holds are learned here)."""
        async with self._learning:
            for piece in pieces:
                if not piece or piece in self._understood:
                    continue
                if piece in self._not_understood:
                    return False
                for _ in range(3):
                    tokens = await self._pieces(piece)
                    split = await self._ids(Layout(piece, [(0, len(piece))], 0).parts(self.controls) or [],
                                            parse_special=False)
                    if [t for t, _ in tokens] == split:
                        self._understood.add(piece)
                        break
                    if not await self._learn(tokens, set(split)):
                        break  # a split llama.cpp makes otherwise (a token that strips the space beside it)
                if piece not in self._understood:
                    self._not_understood.add(piece)
                    return False
            for known in (self._understood, self._not_understood):
                if len(known) > 10_000:
                    known.clear()
        return True

    async def _learn(self, tokens: list[tuple[int, str | None]], plain: set[int]) -> bool:
        """Learns the control tokens among a text's `tokens` (with parse_special on): those that its text
        never gives as plain text (not among `plain`, its ids with parse_special off, nor alone); whether
        any was new."""
        new = False
        for token, piece in tokens:
            if token in plain or token in self._text_ids or not piece or self.controls.get(piece) == token:
                continue
            if await self._ids(piece, parse_special=False) == [token]:
                self._text_ids.add(token)
            else:
                self.controls[piece], new = token, True
        return new

    async def _controls_in(self, text: str) -> list[int]:
        """The control ids of `text` tokenised with parse_special on."""
        tokens = await self._pieces(text)
        await self._learn(tokens, set(await self._ids(text, parse_special=False)))
        ours = set(self.controls.values())
        return [t for t, _ in tokens if t in ours]

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
        """`text` with its special tokens parsed; `start`: the beginning of a sequence, with the BOS token
        a vocabulary adds there (the server's template leaves it out when it does)."""
        return await self._ids(text, add_special=start)

    async def _ids(self, content: str | list[str | int], parse_special: bool = True, add_special: bool = False) -> list[int]:
        """llama.cpp's tokenisation of a text, or of texts and ids mixed (each text tokenised alone)."""
        answer = await self.post("/tokenize", {"content": content, "add_special": add_special,
                                               "parse_special": parse_special})
        return [int(t) for t in answer["tokens"]]

    async def _pieces(self, text: str) -> list[tuple[int, str | None]]:
        """(id, its text) per token of `text` with special tokens parsed; None for a piece of a character."""
        answer = await self.post("/tokenize", {"content": text, "add_special": False, "parse_special": True,
                                               "with_pieces": True})
        return [(int(t["id"]), t["piece"] if isinstance(t.get("piece"), str) else None) for t in answer["tokens"]]

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
