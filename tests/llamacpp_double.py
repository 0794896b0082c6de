"""A loopback double of llama.cpp's own server, as --tokens=exact speaks to it: `/props`,
`/apply-template` (ChatML with tools, as Qwen's template writes it), `/tokenize`, `/detokenize` and
`/completion` with a token-id prompt, `return_tokens` and `n_probs`.

Its vocabulary is bytes: every UTF-8 byte b is the id b + 10, and three special tokens have ids of
their own (<|im_start|> 1, <|im_end|> 2, the end of a turn, <|endoftext|> 3). Its replies are played
from a script in the first user message, as tests/scripted_model.py plays them: `{"calls": [[name,
args], ...]}`, `{"answer": text}`, each with an optional `"think"`. A reply's ids are its text's and
the end of turn; each has a log-probability of its own (-0.01 × (position % 7 + 1)), and with
`gaps` every 13th token has none, as llama.cpp leaves out a token inside a split character.
`rethinks`: the template drops the words of every reply but the last (as Qwen3's drops earlier
reasoning), so the history is no longer an extension of what was sent. A step's `"say"` is text
written before its calls. `adds_bos`: its vocabulary puts <|endoftext|> first when asked to add
special tokens (as Llama's and Gemma's do; their templates then leave it out). `escapes`: the
template writes a tool result's text JSON-escaped, not as it is. `truncates`: every
answer says the server dropped part of the prompt to fit its context (an old server's context shift).
`latency`: seconds each completion takes. Every request is kept (`requests`).

`/tokenize` takes what llama.cpp's takes: a text, or texts and ids mixed (each text tokenised alone;
the BOS only before a leading text), `parse_special` (off: the special tokens' text is bytes like any
other), `with_pieces`. A reply is chosen by the turns the model was sent: its `<|im_start|>` ids that
open an assistant turn, not that text.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from tests.loopback import LoopbackServer

SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 3}
NAMES = {v: k for k, v in SPECIAL.items()}
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")


def tokenize(text: str, special: bool = True) -> list[int]:
    ids: list[int] = []
    for piece in _SPLIT.split(text) if special else [text]:
        if piece in SPECIAL and special:
            ids.append(SPECIAL[piece])
        else:
            ids += [b + 10 for b in piece.encode()]
    return ids


def detokenize(ids: list[int]) -> str:
    out, pending = [], bytearray()
    for i in ids:
        if i in NAMES:
            out.append(pending.decode(errors="replace"))
            pending = bytearray()
            out.append(NAMES[i])
        else:
            pending.append(i - 10)
    out.append(pending.decode(errors="replace"))
    return "".join(out)


def tokenizer_json(path: Any) -> str:
    """The double's vocabulary as a tokenizer.json the `tokenizers` library reads (byte-level, no
    merges: byte b is b + 10, the special tokens theirs), for what an export tokenises itself."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]  # ByteLevel's stand-ins for the other bytes
    shown = {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}
    tok = Tokenizer(models.BPE(vocab={**{shown[b]: b + 10 for b in range(256)}, **SPECIAL}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL))
    tok.save(str(path))
    return str(path)


def _piece(token: int) -> str | list[int]:
    """A token's text as llama.cpp's with_pieces gives it: text, or the bytes of part of a character."""
    if token in NAMES:
        return NAMES[token]
    try:
        return bytes([token - 10]).decode()
    except UnicodeDecodeError:
        return [token - 10]


def logprob(position: int) -> float:
    return -0.01 * (position % 7 + 1)


class LlamaCppDouble(LoopbackServer):
    suffix = "/v1"

    def __init__(self, gaps: bool = False, rethinks: bool = False, adds_bos: bool = False, truncates: bool = False,
                 latency: float = 0.0, escapes: bool = False):
        super().__init__()
        self.gaps, self.rethinks, self.adds_bos, self.truncates = gaps, rethinks, adds_bos, truncates
        self.escapes = escapes
        self.latency = latency
        self.requests: list[dict[str, Any]] = []

    # --- the template -------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool) -> str:
        out = []
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else "You are helpful."
        listing = "".join("\n" + json.dumps(t, sort_keys=True) for t in tools or [])
        out.append(f"<|im_start|>system\n{system}" + (f"\n<tools>{listing}\n</tools>" if tools else "") + "<|im_end|>\n")
        last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        for i, m in enumerate(messages):
            role = m["role"]
            if role == "system" and i == 0:
                continue
            if role == "assistant":
                content = m.get("content") or ""
                if self.rethinks and i < last_assistant:  # only the last reply keeps its words
                    content = ""
                calls = "".join(f'\n<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": '
                                f'{c["function"]["arguments"]}}}\n</tool_call>' for c in m.get("tool_calls") or [])
                out.append(f"<|im_start|>assistant\n{content}{calls}<|im_end|>\n")
            elif role == "tool":
                first = i == 0 or messages[i - 1]["role"] != "tool"
                last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                said = json.dumps(m["content"])[1:-1] if self.escapes else m["content"]
                out.append(("<|im_start|>user" if first else "") + f"\n<tool_response>\n{said}\n</tool_response>"
                           + ("<|im_end|>\n" if last else ""))
            else:
                out.append(f"<|im_start|>{role}\n{m['content'] if isinstance(m['content'], str) else ''}<|im_end|>\n")
        if generation:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    # --- the endpoints ------------------------------------------------------------------------
    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response({"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>", "model_path": "/m/double.gguf",
                                  "chat_template": "chatml-double" + ("-rethinks" if self.rethinks else "")})

    async def _apply(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        return web.json_response({"prompt": self.render(body["messages"], body.get("tools"),
                                                        bool(body.get("add_generation_prompt")))})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        content = body["content"] if isinstance(body["content"], list) else [body["content"]]
        leads = bool(content) and isinstance(content[0], str)
        ids = [SPECIAL["<|endoftext|>"]] if self.adds_bos and body.get("add_special") and leads else []
        for part in content:
            ids += [part] if isinstance(part, int) else tokenize(part, bool(body.get("parse_special")))
        if body.get("with_pieces"):
            return web.json_response({"tokens": [{"id": t, "piece": _piece(t)} for t in ids]})
        return web.json_response({"tokens": ids})

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"content": detokenize(body["tokens"])})

    def reply(self, prompt_ids: list[int]) -> list[int]:
        """The scripted reply's ids to this prompt: its text's, then the end of turn."""
        prompt = detokenize(prompt_ids)
        script, _ = json.JSONDecoder().raw_decode(prompt.split("SCRIPT: ", 1)[1])
        opening = [SPECIAL["<|im_start|>"], *tokenize("assistant", special=False)]
        turn = sum(prompt_ids[i:i + len(opening)] == opening for i in range(len(prompt_ids))) - 1
        step = script[min(turn, len(script) - 1)]
        text = (f"<think>{step['think']}</think>" if step.get("think") else "") + str(step.get("say", ""))
        if "calls" in step:
            text += "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in step["calls"])
        else:
            text += str(step.get("answer", ""))
        return tokenize(text, special=False) + [SPECIAL["<|im_end|>"]]  # what a model writes is plain tokens but its end

    async def _completion(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body})
        await asyncio.sleep(self.latency)
        ids = self.reply(body["prompt"])
        limit = int(body.get("n_predict") or -1)
        cut = 0 < limit < len(ids)
        ids = ids[:limit] if cut else ids
        probabilities = [{"id": t, "token": detokenize([t]), "prob": 2.718281828459045 ** logprob(i)}
                         for i, t in enumerate(ids) if not (self.gaps and i % 13 == 12)]
        content = detokenize([t for t in ids if t != SPECIAL["<|im_end|>"]])
        return web.json_response({"content": content, "tokens": ids, "stop_type": "limit" if cut else "eos",
                                  "truncated": self.truncates,
                                  "completion_probabilities": probabilities, "timings": {"cache_n": 0}})

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/props", self._props)
        app.router.add_post("/apply-template", self._apply)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/completion", self._completion)

    def completions(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if r["path"] == "/completion"]
