"""Trajectory compression to a token budget, at export (`--max_tokens`): a trajectory too long for
a trainer's context keeps its start and its end, and only as much of its middle as needed becomes
one summary written by a model.

    protected   the first user message, the first assistant reply and its tool results; the last
                `--keep_last` messages (widened back to a reply, so no result loses its call)
    replaced    from the start of what lies between, the fewest whole replies (each with its
                results) that bring the row under the budget: one user message holds their summary
    counted     the row as the chat template renders it (messages and tools), by a real tokenizer:
                a tokenizer.json, or the embedded model's own vocabulary (read from its GGUF file
                where llm/gguf_vocab.py reads it, else through llama.cpp)
    summarised  by a model, in one request; a middle longer than the summary model reads at once
                (--summary_context; the embedded model's context) in pieces, then the pieces' summaries
                in one (in rounds, while they are still too long together)

A row under the budget is written as it is; one that cannot get under it even with all of its
middle summarised is left out and counted. No model is started until a row needs one: an export
whose rows all fit starts none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import UserError
from ..llm.renderer import tokenizer_from
from ..record.conversation import message_turns, turn

SUMMARY_HEADER = "[A summary of the earlier steps, shortened to fit the context]\n"
SUMMARY_PROMPT = (
    "You shorten the middle of an AI agent's work on a task. Below are the steps to replace: the "
    "agent's replies, its tool calls and their results. Write a summary that lets the work go on "
    "without them: what was tried, which tools were called with which arguments, what they "
    "returned that matters, and what is known now. Plain text, no preamble."
)
COMBINE_PROMPT = ("These are summaries of consecutive parts of those steps, in order. Write one summary of "
                  "them all, as asked above.")
SHOWN_PER_STEP = 4000  # characters of one step shown to the summary model
LOCAL_CONTEXT = 8192  # tokens the embedded model reads at once here (its server's context)
REQUEST_OVERHEAD = 64  # tokens of a request's chat template around its two messages


class CompressionError(UserError):
    pass


class Tokenizer(Protocol):
    name: str

    def count(self, text: str) -> int: ...

    def ids(self, text: str) -> list[int]:
        """The ids of `text` at the start of a sequence (with the BOS a vocabulary adds), special tokens read."""
        ...

    def text(self, ids: list[int]) -> str:
        """What `ids` spell, special tokens written out (export/clean/token_rows.py reads where a text lies)."""
        ...

    def plain_ids(self, text: str) -> list[int]:
        """The ids of `text` inside a sequence: no BOS, special tokens' text as text."""
        ...


class FileTokenizer:
    """A Hugging Face tokenizer.json (the target model's own), through the `tokenizers` library."""

    def __init__(self, path: str):
        self._tok = tokenizer_from(path, "--tokenizer")
        self.name = path

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def ids(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def text(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def plain_ids(self, text: str) -> list[int]:
        self._tok.encode_special_tokens = True  # as the runner tokenised message text (tokens/controls.py)
        try:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        finally:
            self._tok.encode_special_tokens = False


class ServerTokenizer:
    """The vocabulary of the model a llama.cpp server holds (the embedded model's GGUF), by its
    /tokenize endpoint; `base_url` may be a call that starts the server (on first use)."""

    def __init__(self, base_url: str | Callable[[], str], name: str):
        self._base_url, self.name = base_url, name
        self._client: Any = None

    @property
    def _http(self) -> Any:
        if self._client is None:
            import httpx

            url = self._base_url if isinstance(self._base_url, str) else self._base_url()
            self._client = httpx.Client(base_url=url.rsplit("/v1", 1)[0], timeout=120, trust_env=False)
        return self._client

    def count(self, text: str) -> int:
        res = self._http.post("/tokenize", json={"content": text})
        res.raise_for_status()
        return len(res.json()["tokens"])

    def ids(self, text: str) -> list[int]:
        res = self._http.post("/tokenize", json={"content": text, "add_special": True, "parse_special": True})
        res.raise_for_status()
        return [int(t) for t in res.json()["tokens"]]

    def text(self, ids: list[int]) -> str:
        res = self._http.post("/detokenize", json={"tokens": ids})
        res.raise_for_status()
        return str(res.json()["content"])

    def plain_ids(self, text: str) -> list[int]:
        res = self._http.post("/tokenize", json={"content": text, "add_special": False, "parse_special": False})
        res.raise_for_status()
        return [int(t) for t in res.json()["tokens"]]


@dataclass
class Compression:
    max_tokens: int
    keep_last: int
    summary_tokens: int  # the most a summary may take (its request's max_tokens)
    tokenizer: Tokenizer
    summarize: Callable[[list[dict[str, Any]]], str]
    summary_model: str
    render: Callable[[dict[str, Any]], str] = str  # a row as the chat template writes it (export sets it)
    embedded: EmbeddedOnDemand | None = None  # the embedded model, when something of it was asked for (said)
    over: int = 0  # rows found over the budget (compressed, or left out)

    def count(self, row: dict[str, Any]) -> int:
        return self.tokenizer.count(self.render(row))

    def fit(self, row: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(the row, compressed if it had to be; None if it cannot fit), and what was done."""
        before = self.count(row)
        if before <= self.max_tokens:
            return row, None
        self.over += 1
        messages = row["messages"]
        head = _head_end(messages)
        tail = _tail_start(messages, self.keep_last, head)
        if tail <= head:
            return None, {"tokens_before": before, "reason": "nothing between its protected turns to summarise"}
        header = {"role": "user", "content": SUMMARY_HEADER, "reasoning_content": None, "tool_calls": None,
                  "tool_call_id": None, "name": None}
        # replies start where a span may end: the span [head, end) is whole replies with their results
        ends = [j for j in range(head + 1, tail + 1) if j == tail or messages[j]["role"] == "assistant"]
        for end in ends:
            room = self.count({**row, "messages": [*messages[:head], header, *messages[end:]]})
            if room + self.summary_tokens > self.max_tokens:
                continue
            summary = self.summarize(messages[head:end]).strip()
            new = {**row, "messages": [*messages[:head], {**header, "content": SUMMARY_HEADER + summary},
                                       *messages[end:]]}
            after = self.count(new)
            if after <= self.max_tokens:
                return new, {"turns_replaced": end - head, "replaced": [head, end], "tokens_before": before,
                             "tokens_after": after, "summary_model": self.summary_model,
                             "tokenizer": self.tokenizer.name}
        return None, {"tokens_before": before, "reason": "over the budget even with its whole middle summarised"}


def _head_end(messages: list[dict[str, Any]]) -> int:
    """Past the first user message, the first assistant reply and that reply's tool results."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    reply = next((i for i in range(first_user + 1, len(messages)) if messages[i]["role"] == "assistant"), len(messages))
    end = reply + 1
    while end < len(messages) and messages[end]["role"] == "tool":
        end += 1
    return min(end, len(messages))


def _tail_start(messages: list[dict[str, Any]], keep_last: int, head: int) -> int:
    """Where the last `keep_last` messages start, moved back to the reply their results belong to."""
    start = max(head, len(messages) - keep_last)
    while start > head and messages[start]["role"] == "tool":
        start -= 1
    return start


def shown(messages: list[dict[str, Any]]) -> str:
    """The steps to summarise, as the summary model reads them."""
    lines = []
    for m in messages:
        text = (m.get("content") or "")[:SHOWN_PER_STEP]
        if m["role"] == "assistant":
            calls = "; ".join(f"{c['function']['name']}({c['function']['arguments'][:SHOWN_PER_STEP]})"
                              for c in m.get("tool_calls") or [])
            lines.append(f"AGENT: {text}" + (f"\nCALLS: {calls}" if calls else ""))
        elif m["role"] == "tool":
            lines.append(f"RESULT of {m.get('name')}: {text}")
        else:
            lines.append(f"{m['role'].upper()}: {text}")
    return "\n\n".join(lines)


class ModelSummaries:
    """Summaries from an OpenAI-compatible model, on an event loop of its own (export is not async),
    opened on the first summary asked for (`base_url` may be a call that starts the embedded model).
    With a `context` (tokens the model reads at once, counted by `count`), steps too long to read in
    one request are summarised in pieces, then the pieces' summaries together."""

    def __init__(self, settings: Any, api_key: str | None, base_url: str | Callable[[], str] | None = None,
                 count: Callable[[str], int] | None = None, context: int | None = None):
        self.settings, self.api_key, self._base_url = settings, api_key, base_url
        self.count, self.context = count, context
        self.model, self.base_url = settings.model, base_url if isinstance(base_url, str) else settings.base_url
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self.asked = 0  # requests made

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        room = self._room()
        if room is None:
            return self._ask(shown(messages))
        parts = [self._ask(shown(piece)) for piece in _grouped(messages, lambda m: self._count(shown([m])), room)]
        while len(parts) > 1:  # together, in as few requests as they fit in, until one is left
            groups = _grouped(parts, self._count, room - self._count(COMBINE_PROMPT))
            if len(groups) == len(parts) and len(parts) > 2:  # each alone fills a request: two at a time
                groups = [parts[i:i + 2] for i in range(0, len(parts), 2)]
            parts = [self._ask(COMBINE_PROMPT + "\n\n" + "\n\n".join(f"PART {i}: {p}" for i, p in enumerate(group, 1)))
                     for group in groups]
        return parts[0]

    def _room(self) -> int | None:
        """Tokens of steps one request can hold, or None when any number can be sent."""
        if self.context is None or self.count is None:
            return None
        return max(256, self.context - self.settings.max_tokens - self._count(SUMMARY_PROMPT) - REQUEST_OVERHEAD)

    def _count(self, text: str) -> int:
        assert self.count is not None
        return self.count(text)

    def _ask(self, text: str) -> str:
        from ..llm import FatalRunError, PromptFailed, open_client
        from ..util import AdaptiveLimit

        if self._client is None:
            if callable(self._base_url):
                self.base_url = self._base_url()
                self.settings = self.settings.model_copy(update={"base_url": self.base_url})
            self._loop = asyncio.new_event_loop()

            async def opened() -> Any:
                return open_client(self.settings, self.api_key, AdaptiveLimit(4))

            self._client = self._loop.run_until_complete(opened())
        assert self._loop is not None
        self.asked += 1
        try:
            reply = self._loop.run_until_complete(self._client.complete(
                [{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": text}], []))
        except (PromptFailed, FatalRunError) as exc:
            raise CompressionError(f"the summary model {self.model} at {self.base_url} gave no summary: {exc} "
                                   "(--summary_model, --summary_base_url)") from None
        return reply.content or ""

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self._client.close())
            self._loop.close()


def _grouped(items: list[Any], size: Callable[[Any], int], room: int) -> list[list[Any]]:
    """`items` in order, in the fewest consecutive groups of at most `room` (one too big goes alone)."""
    groups: list[list[Any]] = []
    used = room + 1
    for item in items:
        n = size(item) + 2  # (the blank line between two)
        if used + n > room:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += n
    return groups


class EmbeddedOnDemand:
    """The embedded model's endpoint, started the first time it is asked for (and said), ended with `stack`."""

    def __init__(self, stack: contextlib.ExitStack, say: Callable[[str], None]):
        self.stack, self.say, self._url = stack, say, ""

    def __call__(self) -> str:
        from ..llm.local_model import embedded_endpoint

        if not self._url:
            self._url = self.stack.enter_context(embedded_endpoint(
                None, threads=None, ctx=LOCAL_CONTEXT, parallel=1,
                log_path=Path(tempfile.gettempdir()) / "hermes-export-model.log", say=self.say))
        return self._url

    @property
    def started(self) -> bool:
        return bool(self._url)


def local_tokenizer(embedded: EmbeddedOnDemand) -> Tokenizer:
    """The embedded model's vocabulary: read from its GGUF file where that can be done (no model is
    started to count), else its server's."""
    from ..llm.gguf_vocab import tokenizer_file
    from ..llm.local_model import cache_dir, resolve_model_file

    made = tokenizer_file(resolve_model_file(None, progress=False), cache_dir().parent / "tokenizers")
    if made is None:
        return ServerTokenizer(embedded, "local:gguf")
    tokenizer = FileTokenizer(str(made))
    tokenizer.name = "local:gguf"
    return tokenizer


def note(metadata: str, info: dict[str, Any]) -> str:
    """An openai row's metadata (JSON text) saying what compression did to it."""
    return json.dumps({**json.loads(metadata), "compressed": info}, ensure_ascii=False)


def compressed_record(rec: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The record as --format=sharegpt writes it when its openai row was compressed: the turns of the
    replaced messages give way to one human turn holding their summary, the record's metadata says
    so, and token ids (which were of the whole) are left out; a row not compressed is as it was."""
    info = json.loads(row["metadata"]).get("compressed")
    if not info:
        return rec
    head, end = info["replaced"]
    turns, at = rec["conversations"], message_turns(rec)
    first, after = at[head], (at[end] if end < len(at) else len(turns))
    summary = row["messages"][head]["content"]
    out = {**rec, "conversations": [*turns[:first], turn("human", summary, summary), *turns[after:]],
           "metadata": {**(rec.get("metadata") or {}), "compressed": info}}
    out.pop("tokens", None)  # the rollout's ids are of the whole conversation, not of this one
    return out


@contextlib.contextmanager
def compression_for(opts: Any, say: Callable[[str], None]) -> Iterator[Compression | None]:
    """The compression `export --max_tokens` asks for, its models served while the block lasts
    (the embedded one, when the tokenizer or the summaries are `local`)."""
    if opts.max_tokens is None:
        yield None
        return
    from ..llm import DEFAULT_BASE_URL, ModelSettings
    from ..llm.local_model import LOCAL_MODEL_NAME

    with contextlib.ExitStack() as stack:
        embedded = EmbeddedOnDemand(stack, say)
        tokenizer = local_tokenizer(embedded) if opts.tokenizer == LOCAL_MODEL_NAME else FileTokenizer(opts.tokenizer)
        key: str | None
        where: str | Callable[[], str]
        if opts.summary_model == LOCAL_MODEL_NAME:
            where, key, context = embedded, "local", opts.summary_context or LOCAL_CONTEXT
        else:
            where = opts.summary_base_url or DEFAULT_BASE_URL
            key = (os.environ.get("SUMMARY_API_KEY") or os.environ.get("OPENROUTER_API_KEY")
                   or os.environ.get("OPENAI_API_KEY"))
            context = opts.summary_context
        # few retries: an export is run at the desk, and one that stops loses nothing
        settings = ModelSettings.model_validate({"model": opts.summary_model, "temperature": 0.0, "max_retries": 2,
                                                 "max_tokens": opts.summary_tokens,
                                                 **({"base_url": where} if isinstance(where, str) else {})})
        summaries = ModelSummaries(settings, key, where, tokenizer.count, context)
        stack.callback(summaries.close)
        yield Compression(max_tokens=opts.max_tokens, keep_last=opts.keep_last, summary_tokens=opts.summary_tokens,
                          tokenizer=tokenizer, summarize=summaries, summary_model=opts.summary_model,
                          embedded=embedded)
