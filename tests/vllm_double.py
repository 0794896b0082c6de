"""A loopback double of vLLM's OpenAI-compatible server, as --tokens=exact --token_server=vllm speaks
to it, its requests and answers shaped as vLLM's own protocol writes them
(vllm/entrypoints/openai/protocol.py): `GET /v1/models`; `POST /tokenize` (a chat: `messages`,
`tools`, `add_generation_prompt`; or a `prompt`) answering `{count, max_model_len, tokens}`;
`POST /detokenize` answering `{prompt}`; `POST /v1/completions` with a token-id `prompt`,
`logprobs` and `return_token_ids`, answering choices with `text`, `token_ids`, `prompt_token_ids`,
`logprobs: {text_offset, token_logprobs, tokens, top_logprobs}`, `finish_reason`, `stop_reason`.

`POST /v1/chat/completions` (what --tokens=record asks): the chat rendered by the template and
tokenised, the reply's tool calls read server-side (vLLM's hermes parser: `<tool_call>` blocks, the
text before them the content), `logprobs: {content: [{token, logprob, bytes, top_logprobs}]}` with
`logprobs`, and with `return_token_ids` the response's `prompt_token_ids` and the choice's
`token_ids`. `refuses_token_ids`: it answers 400 to a request naming `return_token_ids`, as OpenAI's
API refuses an argument it does not know.

The vocabulary, template and scripted replies are tests/llamacpp_double.py's. With `drops_end`, a
reply's ids leave out its end-of-turn token, as a server may.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from tests.llamacpp_double import SPECIAL, LlamaCppDouble, detokenize, logprob, tokenize

MAX_MODEL_LEN = 32768
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class VLLMDouble(LlamaCppDouble):
    def __init__(self, drops_end: bool = False, gaps: bool = False, refuses_token_ids: bool = False,
                 latency: float = 0.0):
        super().__init__(gaps=gaps, latency=latency)
        self.drops_end, self.refuses_token_ids = drops_end, refuses_token_ids

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "double-model", "object": "model",
                                                              "max_model_len": MAX_MODEL_LEN}]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        if "messages" in body:
            text = self.render(body["messages"], body.get("tools"), bool(body.get("add_generation_prompt", True)))
            ids = tokenize(text)
        else:
            ids = tokenize(body["prompt"])
        return web.json_response({"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids, "token_strs": None})

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": detokenize(body["tokens"])})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        prompt = body["prompt"]
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return web.json_response({"object": "error", "message": "the double takes token ids", "code": 400},
                                     status=400)
        ids = self.reply(prompt)
        limit = int(body.get("max_tokens") or 16)
        cut = limit < len(ids)
        ids = ids[:limit] if cut else ids
        if self.drops_end and not cut:
            ids = ids[:-1]
        shown = [t for t in ids if t != SPECIAL["<|im_end|>"]]
        logprobs = None
        if body.get("logprobs") is not None:
            lps: list[float | None] = [None if self.gaps and i % 13 == 12 else logprob(i) for i in range(len(ids))]
            logprobs = {"text_offset": list(range(len(ids))), "token_logprobs": lps,
                        "tokens": [detokenize([t]) for t in ids],
                        "top_logprobs": [{detokenize([t]): lp} if lp is not None else None for t, lp in zip(ids, lps, strict=True)]}
        choice: dict[str, Any] = {"index": 0, "text": detokenize(shown), "logprobs": logprobs,
                                  "finish_reason": "length" if cut else "stop", "stop_reason": None,
                                  "prompt_logprobs": None}
        if body.get("return_token_ids"):
            choice["token_ids"], choice["prompt_token_ids"] = ids, prompt
        return web.json_response({"id": "cmpl-double", "object": "text_completion", "created": 0,
                                  "model": body.get("model"), "choices": [choice],
                                  "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                            "total_tokens": len(prompt) + len(ids)}})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        await asyncio.sleep(self.latency)
        if self.refuses_token_ids and "return_token_ids" in body:
            return web.json_response({"error": {"message": "Unrecognized request argument supplied: return_token_ids",
                                                "type": "invalid_request_error", "code": None}}, status=400)
        prompt = tokenize(self.render(body["messages"], body.get("tools"), True))
        ids = self.reply(prompt)
        limit = int(body.get("max_tokens") or MAX_MODEL_LEN)
        cut = limit < len(ids)
        ids = ids[:limit] if cut else ids
        text = detokenize([t for t in ids if t != SPECIAL["<|im_end|>"]])
        calls = [json.loads(c) for c in _CALL.findall(text)]
        message: dict[str, Any] = {"role": "assistant", "content": text.split("<tool_call>", 1)[0] or None,
                                   "tool_calls": [{"id": f"chatcmpl-tool-{k}", "type": "function", "function": {
                                       "name": c["name"], "arguments": json.dumps(c["arguments"])}}
                                       for k, c in enumerate(calls)]}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "stop_reason": None,
                                  "finish_reason": "length" if cut else ("tool_calls" if calls else "stop")}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": detokenize([t]), "logprob": logprob(i), "bytes": list(detokenize([t]).encode()),
                 "top_logprobs": []} for i, t in enumerate(ids)]}
        answer: dict[str, Any] = {"id": "chatcmpl-double", "object": "chat.completion", "created": 0,
                                  "model": body.get("model"), "choices": [choice],
                                  "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                            "total_tokens": len(prompt) + len(ids)}}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"], choice["token_ids"] = prompt, ids
        return web.json_response(answer)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
