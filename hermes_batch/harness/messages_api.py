"""Anthropic's Messages API (`POST /v1/messages`), as Claude Code and the `anthropic` SDK speak it,
translated to one call of the run's model client and its reply back: the system prompt (a string
or text blocks) becomes the system message, `tool_use` blocks tool calls, `tool_result` blocks
tool messages paired by id (their images shown after them and kept: wire.results), thinking
blocks reasoning; the reply is a message of content blocks, whole or streamed as the API's
server-sent events.

Thinking: the endpoint signs the thinking it returns with a digest of its text (`signature`), so
a client that sends back only signed thinking (Claude Code) keeps it; the signature is not secret
and proves nothing but that the text came back as given. Thinking sent back under its own
signature, or with none, is the reasoning the model wrote (`reasoning_content`, as before). A
thinking block signed by another (Anthropic's own, say) and a `redacted_thinking` block (whose
`data` only Anthropic can read) are also kept whole, in order, in the turn's `reasoning_details`
as OpenRouter writes Anthropic's (`reasoning.text` with its signature, `reasoning.encrypted`):
the record keeps them, and a provider that signs its thoughts gets them back, as the native loop
sends them."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..llm import Completion
from ..tools.base import Image
from .wire import Ask, Part, Refused, arguments, content, event, named, results

# what a harness may ask that the run decides instead (kept in the call's record as asked)
OVERRIDDEN = ("model", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "thinking")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Loose):
    type: Literal["text"]
    text: str


class ImageBlock(_Loose):
    type: Literal["image"]
    source: dict[str, Any]


class ToolUseBlock(_Loose):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(_Loose):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Loose):
    type: Literal["redacted_thinking"]
    data: str


class OtherBlock(_Loose):
    type: str  # documents, server tools' blocks: no Chat Completions form, left out


class ToolResultBlock(_Loose):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock | OtherBlock, Field(union_mode="left_to_right")]] = ""
    is_error: bool = False


# a block of a kind it knows, else one it leaves out
Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
                  | OtherBlock, Field(union_mode="left_to_right")]


class Message(_Loose):
    role: Literal["user", "assistant"]
    content: str | list[Block] = Field(union_mode="left_to_right")


class Tool(_Loose):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None  # none: a tool the API's servers run (web search, ...)


class Request(_Loose):
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    system: str | list[Annotated[TextBlock | OtherBlock, Field(union_mode="left_to_right")]] | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: dict[str, Any] | None = None
    stream: bool = False


def ask(body: dict[str, Any]) -> Ask:
    """A Messages API request as one Chat Completions call."""
    try:
        req = Request.model_validate(body)
    except ValueError as exc:
        raise Refused(f"not a Messages API request: {exc}") from None
    messages: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "\n\n".join(
            b.text for b in req.system if isinstance(b, TextBlock))
        messages.append({"role": "system", "content": system})
    images: dict[str, tuple[Image, ...]] = {}
    for m in req.messages:
        messages.extend(_assistant(m.content) if m.role == "assistant" else _user(m.content, images))
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.input_schema}} for t in req.tools if t.input_schema]
    return Ask(named(messages), tools, _tool_choice(req.tool_choice), {k: body[k] for k in OVERRIDDEN if k in body},
               req.stream, images)


def _user(said: str | list[Any], images: dict[str, tuple[Image, ...]]) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages (first, as the calls they answer came last),
    their images after them, then what the user said."""
    if isinstance(said, str):
        return [{"role": "user", "content": said}]
    out = results([(b.tool_use_id, _parts(b.content)) for b in said if isinstance(b, ToolResultBlock)], images)
    if parts := _parts(said):
        out.append({"role": "user", "content": content(parts)})
    return out


def _assistant(content: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "assistant", "content": content}]
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(b.text for b in content if isinstance(b, TextBlock)) or None}
    thinking = "".join(b.thinking for b in content if isinstance(b, ThinkingBlock))
    if thinking:
        message["reasoning_content"] = thinking
    if any(isinstance(b, RedactedThinkingBlock) or (isinstance(b, ThinkingBlock) and _foreign(b)) for b in content):
        message["reasoning_details"] = _details(content)
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
             for b in content if isinstance(b, ToolUseBlock)]
    if calls:
        message["tool_calls"] = calls
    return [message]


def _parts(blocks: str | list[Any]) -> list[Part]:
    """The text and image blocks among `blocks` (a tool result's or the user's), in order."""
    if isinstance(blocks, str):
        return [("text", blocks)]
    return [("text", b.text) if isinstance(b, TextBlock) else ("image", _url(b.source)) for b in blocks
            if isinstance(b, TextBlock | ImageBlock)]


def _url(source: dict[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    return str(source.get("url") or source.get("file_id") or source)  # a URL, or a file of Anthropic's Files API


def signature(thinking: str) -> str:
    """The endpoint's signature of thinking it returns: a digest of its text (not base64, so a
    client that decodes Anthropic's own finds nothing in it)."""
    return f"hermes-batch:{hashlib.sha256(thinking.encode()).hexdigest()}"


def _foreign(block: ThinkingBlock) -> bool:
    """Thinking signed by another than this endpoint (or changed since it signed it)."""
    return bool(block.signature) and block.signature != signature(block.thinking)


def _details(blocks: list[Any]) -> list[dict[str, Any]]:
    """A turn's thinking as OpenRouter writes Anthropic's in `reasoning_details`: each block, in order."""
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, ThinkingBlock):
            out.append({"type": "reasoning.text", "text": b.thinking, "signature": b.signature or None})
        elif isinstance(b, RedactedThinkingBlock):
            out.append({"type": "reasoning.encrypted", "data": b.data})
    return [{**d, "format": "anthropic-claude-v1", "index": i} for i, d in enumerate(out)]


def _tool_choice(choice: dict[str, Any] | None) -> Any:
    kind = (choice or {}).get("type")
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": (choice or {}).get("name")}}
    return None


# --- the reply ---------------------------------------------------------------------------------

class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Reply(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None = None
    usage: Usage


def _stop_reason(reply: Completion) -> str:
    if reply.tool_calls:
        return "tool_use"
    return "max_tokens" if reply.finish_reason == "length" else "end_turn"


def _usage(reply: Completion) -> Usage:
    u = reply.usage or {}
    cached = int(((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return Usage(input_tokens=int(u.get("prompt_tokens") or 0) - cached, output_tokens=int(u.get("completion_tokens") or 0),
                 cache_read_input_tokens=cached)


def _blocks(reply: Completion, thinking: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if thinking and reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": signature(reply.reasoning)})
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": arguments(c["arguments"])}
               for c in reply.tool_calls]
    return blocks


def reply(completion: Completion, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Messages API's answer (thinking blocks only to a harness that asked for thinking)."""
    return Reply(id=f"msg_{uuid.uuid4().hex[:24]}", model=model, content=_blocks(completion, _thinks(body)),
                 stop_reason=_stop_reason(completion), usage=_usage(completion)).model_dump()


async def stream(completion: Completion, model: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """The answer as the Messages API streams it: message_start, each block opened, its delta
    (text, thinking, a tool's input as JSON) and closed, message_delta with the stop, message_stop."""
    usage = _usage(completion)
    head = Reply(id=f"msg_{uuid.uuid4().hex[:24]}", model=model, content=[], stop_reason=None,
                 usage=Usage(input_tokens=usage.input_tokens, cache_read_input_tokens=usage.cache_read_input_tokens))
    yield event("message_start", {"type": "message_start", "message": head.model_dump()})
    for i, block in enumerate(_blocks(completion, _thinks(body))):
        kind = block["type"]
        opened = {**block, "text": ""} if kind == "text" else {**block, "thinking": "", "signature": ""} \
            if kind == "thinking" else {**block, "input": {}}
        yield event("content_block_start", {"type": "content_block_start", "index": i, "content_block": opened})
        delta = {"type": "text_delta", "text": block["text"]} if kind == "text" else \
            {"type": "thinking_delta", "thinking": block["thinking"]} if kind == "thinking" else \
            {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
        if kind == "thinking":
            yield event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                "delta": {"type": "signature_delta", "signature": block["signature"]}})
        yield event("content_block_stop", {"type": "content_block_stop", "index": i})
    yield event("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": _stop_reason(completion), "stop_sequence": None},
                                  "usage": {"output_tokens": usage.output_tokens}})
    yield event("message_stop", {"type": "message_stop"})


def _thinks(body: dict[str, Any]) -> bool:
    return isinstance(body.get("thinking"), dict) and body["thinking"].get("type") in ("enabled", "adaptive")


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """`POST /v1/messages/count_tokens`: an estimate (a character in four), as the run's tokenizer is not here."""
    return {"input_tokens": len(json.dumps(body, ensure_ascii=False)) // 4}


def error(status: int, message: str) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


