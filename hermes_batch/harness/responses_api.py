"""OpenAI's Responses API (`POST /v1/responses`), as Codex and the `openai` SDK speak it, translated
to one call of the run's model client and its reply back: `instructions` and system or developer
messages become system messages, `function_call` items tool calls, `function_call_output` items
tool messages paired by `call_id` (their images shown after them and kept: wire.results),
reasoning items reasoning; the reply is a response of output items, whole or streamed as the
API's server-sent events. The endpoint keeps no responses: a harness sends its whole input each
time (`store: false`), as Codex does."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..llm import Completion
from ..tools.base import Image
from .wire import Ask, Part, Refused, content, event, named, results

OVERRIDDEN = ("model", "max_output_tokens", "temperature", "top_p", "reasoning", "top_logprobs")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Loose):
    type: str  # input_text, output_text, input_image, ...
    text: str | None = None
    image_url: str | None = None
    file_id: str | None = None


class MessageItem(_Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCall(_Loose):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = ""


class FunctionCallOutput(_Loose):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class Reasoning(_Loose):
    type: Literal["reasoning"]
    summary: list[ContentPart] = Field(default_factory=list)


class OtherItem(_Loose):
    type: str  # items with no Chat Completions form (a server tool's call): left out


# an item of a kind it knows, else one it leaves out
Item = Annotated[MessageItem | FunctionCall | FunctionCallOutput | Reasoning | OtherItem, Field(union_mode="left_to_right")]


class Tool(_Loose):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Request(_Loose):
    model: str = ""
    input: str | list[Item] = Field(union_mode="left_to_right")
    instructions: str | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    stream: bool = False


def ask(body: dict[str, Any]) -> Ask:
    """A Responses API request as one Chat Completions call."""
    try:
        req = Request.model_validate(body)
    except ValueError as exc:
        raise Refused(f"not a Responses API request: {exc}") from None
    if req.previous_response_id:
        raise Refused("this endpoint keeps no responses: send the whole input (store: false), "
                      "not previous_response_id")
    messages: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    images: dict[str, tuple[Image, ...]] = {}
    outputs: list[FunctionCallOutput] = []  # a turn's results, added together (their images after them all)
    for item in [*items, None]:
        if isinstance(item, FunctionCallOutput):
            outputs.append(item)
            continue
        messages += results([(o.call_id, _parts(o.output)) for o in outputs], images)
        outputs = []
        if item is not None:
            _add(messages, item)
    if not messages:
        raise Refused("`input` holds nothing to answer")
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.parameters or {"type": "object", "properties": {}}}}
             for t in req.tools if t.type == "function" and t.name]
    return Ask(named(messages), tools, _tool_choice(req.tool_choice), {k: body[k] for k in OVERRIDDEN if k in body},
               req.stream, images)


def _add(messages: list[dict[str, Any]], item: Any) -> None:
    """One input item onto the Chat Completions messages (a call joins the assistant turn before it)."""
    last = messages[-1] if messages else None
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        if role == "assistant" and last is not None and last["role"] == "assistant" and not last.get("content"):
            last["content"] = _text(item.content)  # reasoning before it, in one turn
            return
        messages.append({"role": role, "content": content(_parts(item.content))})
    elif isinstance(item, FunctionCall):
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif isinstance(item, Reasoning):
        summary = "\n\n".join(p.text or "" for p in item.summary)
        if summary:
            messages.append({"role": "assistant", "content": None, "reasoning_content": summary})


def _parts(given: str | list[ContentPart]) -> list[Part]:
    """The text and images of a message or a call's output, in order."""
    if isinstance(given, str):
        return [("text", given)]
    return [("image", p.image_url or p.file_id or "") if p.type == "input_image" else ("text", p.text or "")
            for p in given if p.type == "input_image" or p.text is not None]


def _text(given: str | list[ContentPart]) -> str:
    return given if isinstance(given, str) else "\n\n".join(p.text for p in given if p.text is not None)


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if choice in ("required", "none"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return None


# --- the reply ---------------------------------------------------------------------------------

class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)


def _output(reply: Completion) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if reply.reasoning:
        out.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:24]}",
                    "summary": [{"type": "summary_text", "text": reply.reasoning}]})
    if reply.content:
        out.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
    out += [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": c["id"], "name": c["name"],
             "arguments": c["arguments"], "status": "completed"} for c in reply.tool_calls]
    return out


def _response(reply: Completion | None, model: str, body: dict[str, Any], rid: str, output: list[dict[str, Any]]
              ) -> Response:
    cut = reply is not None and reply.finish_reason == "length" and not reply.tool_calls
    u = (reply.usage if reply else None) or {}
    usage = {"input_tokens": int(u.get("prompt_tokens") or 0), "output_tokens": int(u.get("completion_tokens") or 0),
             "total_tokens": int(u.get("total_tokens") or 0),
             "input_tokens_details": {"cached_tokens": int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)},
             "output_tokens_details": {"reasoning_tokens": 0}}
    return Response(id=rid, created_at=int(time.time()), model=model, output=output,
                    status="in_progress" if reply is None else "incomplete" if cut else "completed",
                    usage=usage if reply is not None else None,
                    incomplete_details={"reason": "max_output_tokens"} if cut else None,
                    instructions=body.get("instructions"), tools=body.get("tools") or [],
                    tool_choice=body.get("tool_choice") or "auto")


def reply(completion: Completion, model: str, body: dict[str, Any]) -> dict[str, Any]:
    return _response(completion, model, body, f"resp_{uuid.uuid4().hex[:24]}", _output(completion)).model_dump()


async def stream(completion: Completion, model: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """The answer as the Responses API streams it: created, each output item added, its text or
    arguments as a delta and done, the item done, completed (with the whole response)."""
    rid, seq = f"resp_{uuid.uuid4().hex[:24]}", 0

    def send(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return event(kind, {"type": kind, "sequence_number": seq - 1, **data})

    yield send("response.created", response=_response(None, model, body, rid, []).model_dump())
    yield send("response.in_progress", response=_response(None, model, body, rid, []).model_dump())
    output = _output(completion)
    for i, item in enumerate(output):
        where = {"output_index": i, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield send("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []})
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield send("response.content_part.added", **where, content_index=0, part=empty)
            yield send("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])
            yield send("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            yield send("response.content_part.done", **where, content_index=0, part=item["content"][0])
        elif item["type"] == "function_call":
            yield send("response.output_item.added", output_index=i,
                       item={**item, "status": "in_progress", "arguments": ""})
            yield send("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield send("response.function_call_arguments.done", **where, arguments=item["arguments"])
        else:
            yield send("response.output_item.added", output_index=i, item={**item, "summary": []})
            text = item["summary"][0]["text"]
            yield send("response.reasoning_summary_part.added", **where, summary_index=0,
                       part={"type": "summary_text", "text": ""})
            yield send("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text)
            yield send("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
            yield send("response.reasoning_summary_part.done", **where, summary_index=0, part=item["summary"][0])
        yield send("response.output_item.done", output_index=i, item=item)
    done = _response(completion, model, body, rid, output)
    yield send(f"response.{done.status}" if done.status == "incomplete" else "response.completed",
               response=done.model_dump())


def error(status: int, message: str) -> dict[str, Any]:
    kind = "authentication_error" if status == 401 else "invalid_request_error" if status < 500 else "api_error"
    return {"error": {"message": message, "type": kind}}
