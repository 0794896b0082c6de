"""A loopback double of SGLang's server, as --tokens=exact --token_server=sglang speaks to it, its
requests and answers shaped as SGLang's own protocol writes them (sglang/srt/managers/io_struct.py's
GenerateReqInput; the answer as its tokenizer manager returns it): `GET /v1/models` (a model card with
`max_model_len`); `POST /generate` with `input_ids`, `sampling_params` and `return_logprob`, answering
`{text, output_ids, meta_info: {id, finish_reason: {type, matched | length}, prompt_tokens,
completion_tokens, cached_tokens, output_token_logprobs: [[logprob, id, null], ...]}}`. SGLang renders
no chat for a client: the runner does, with the model's template and tokenizer (here the double's
vocabulary as a tokenizer.json, tests/llamacpp_double.py's tokenizer_json).

The scripted replies are tests/llamacpp_double.py's. With `drops_end`, a reply's ids leave out its
end-of-turn token; with `other_end`, a final answer ends on <|endoftext|> (another end token SGLang
stops on, as Qwen's tokenizer names two)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.llamacpp_double import SPECIAL, LlamaCppDouble, detokenize, logprob

MAX_MODEL_LEN = 32768


class SGLangDouble(LlamaCppDouble):
    def __init__(self, drops_end: bool = False, other_end: bool = False):
        super().__init__()
        self.drops_end, self.other_end = drops_end, other_end

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "double-model", "object": "model", "owned_by": "sglang",
                                                              "root": "double-model", "max_model_len": MAX_MODEL_LEN}]})

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        prompt = body.get("input_ids")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return web.json_response({"error": {"message": "the double takes input_ids"}}, status=400)
        ids = self.reply(prompt)
        limit = int((body.get("sampling_params") or {}).get("max_new_tokens") or 128)  # SGLang's default
        cut = limit < len(ids)
        ids = ids[:limit] if cut else ids
        if self.drops_end and not cut:
            ids = ids[:-1]
        if self.other_end and b"<tool_call>" not in bytes(t - 10 for t in ids if t >= 10):
            ids = [*ids[:-1], SPECIAL["<|endoftext|>"]]
        meta: dict[str, Any] = {"id": "double", "prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                "cached_tokens": 0,
                                "finish_reason": {"type": "length", "length": limit} if cut
                                else {"type": "stop", "matched": ids[-1]}}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[logprob(i), t, None] for i, t in enumerate(ids)]
        return web.json_response({"text": detokenize([t for t in ids if t != SPECIAL["<|im_end|>"]]),
                                  "output_ids": ids, "meta_info": meta})

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/generate", self._generate)

    def generations(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if r["path"] == "/generate"]
