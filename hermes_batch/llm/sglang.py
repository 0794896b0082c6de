"""`--tokens=exact --token_server=sglang`: token ids in and out against an SGLang server.

SGLang generates from ids (`POST /generate` with `input_ids` and `return_logprob`, answering the
sampled ids with their log-probabilities in `meta_info.output_token_logprobs`) but renders no chat
for a client, so the runner renders and tokenises with the model's own chat template and tokenizer
(`--chat_template_file`, `--tokenizer_file`: llm/renderer.py), a message's text as text. How a
rollout's ids are carried from call to call, and where a new segment starts, is vLLM's way
(vllm.py): the same ids, rendered here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import FatalRunError, ModelSettings
from .renderer import LocalRenderer
from .token_client import Generated, finite
from .vllm import NEUTRAL, PROBE, VLLMClient  # SGLang's sampling parameters bear vLLM's names


class SGLangClient(VLLMClient):
    server = "sglang"
    plain_text = True  # rendered and tokenised here, every message's text as text (renderer.py)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        s = self.settings
        if not (s.tokenizer_file and s.chat_template_file):  # the run's settings check this first
            raise FatalRunError("--token_server=sglang needs --tokenizer_file and --chat_template_file")
        self.renderer = LocalRenderer(s.tokenizer_file, s.chat_template_file)

    @staticmethod
    async def check(settings: ModelSettings, api_key: str | None) -> str | None:
        # the tokenizer and template read before any work, naming the flag: a worker would die of them
        await asyncio.to_thread(LocalRenderer, settings.tokenizer_file or "", settings.chat_template_file or "")
        return await VLLMClient.check(settings, api_key)

    async def identify(self) -> tuple[str, str]:
        await super().identify()  # the model served, the end of a turn, the Hermes format: as vLLM's
        return self.renderer.identity

    async def _chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> list[int]:
        return await asyncio.to_thread(self.renderer.ids, messages, tools, generation)

    async def _detokenize(self, ids: list[int]) -> str:
        return self.renderer.detokenize(ids)

    async def _probe(self) -> list[int]:
        return self.renderer.tokenize(PROBE)

    async def generate(self, prompt: list[int], seed: int | None, model: str | None = None) -> Generated:
        # one model per server: `model` names the weights it serves (a trainer's version), which it does not read
        left = self.context - len(prompt) if self.context else 4096  # SGLang's own default is 128 new tokens
        params: dict[str, Any] = {"temperature": self.temperature, **NEUTRAL,
                                  "max_new_tokens": min(self.settings.max_tokens, left) if self.settings.max_tokens
                                  else left}
        if seed is not None:
            params["sampling_seed"] = seed
        answer = await self.post("/generate", {"input_ids": prompt, "sampling_params": params, "return_logprob": True,
                                               "logprob_start_len": -1})
        meta = answer.get("meta_info") or {}
        sampled = meta.get("output_token_logprobs")
        if not isinstance(sampled, list):
            raise FatalRunError(f"the SGLang server at {self.base} returned no output_token_logprobs: "
                                "--tokens=exact needs return_logprob")
        ids = [int(entry[1]) for entry in sampled]
        logprobs = [finite(entry[0]) for entry in sampled]
        # read as the ids say, by the same tokenizer, special tokens left out (another end token SGLang stopped on)
        text = self.renderer.detokenize(ids, skip_special=True)
        finish = (meta.get("finish_reason") or {}).get("type")
        return Generated(ids, logprobs, text, finish == "length", int(meta.get("cached_tokens") or 0))
