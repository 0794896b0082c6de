"""The record's conversation, both ways: ShareGPT turns in Hermes text, rendered from the agent's
messages, and the messages read back from a record (for export and the viewer).

Each turn keeps the message as it was (`content`: what the model was sent or wrote, byte for byte;
`reasoning`; `tool_calls` with ids and the arguments as written) beside `value`, its Hermes text
(`<think>`, `<tool_call>`, `<tool_response>`), so nothing is ever re-derived from `value`: a reply
that merely mentions `<tool_call>` stays what it was. Every turn has the same keys (one Arrow schema).

As the Hermes Agent writes them, the results of one reply's calls are one `tool` turn: its `value`
holds a `<tool_response>` per call, in call order, and its `tool_results` each result as the model
read it (`content`), paired with its call by `tool_call_id`, with the images the call saw or made
(record/images.py; `shown`: the model itself was shown them, with --vision_model=main). Records of
format 3 and before have a turn per result (`content`, `name`, `tool_call_id`, `images` on the turn):
`tool_results` reads both.

A tool's result is a JSON value inside `<tool_response>` only when the tool returned structured
data (the terminal's `{output, exit_code, error}`, a file tool's answer); free text is a string
there, as written. Records from before `content` existed are read back from `value`, where a text
result that looked like JSON had been stored as a JSON value (`legacy_turns`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .images import ref

TURN_KEYS = ("from", "value", "content", "reasoning", "tool_calls", "name", "tool_call_id", "reasoning_details",
             "images", "tool_results")

# The frame the Hermes Agent saves its tools in (an opening, the tools as JSON between <tools> tags, the
# schema of a call, how calls are written, an example), in this product's words.
FUNCTION_CALL_SCHEMA = ("{'title': 'FunctionCall', 'type': 'object', 'properties': {'name': {'title': 'Name', 'type': "
                        "'string'}, 'arguments': {'title': 'Arguments', 'type': 'object'}}, 'required': ['name', "
                        "'arguments']}")
HERMES_SYSTEM_TEMPLATE = (
    "You are a function calling AI model. The functions you may call are described inside <tools> </tools> XML "
    "tags. Call one or more of them when they help with the user's request; when none does, answer in plain "
    "language. Do not guess the values to pass to a function. Each function's result comes back to you inside "
    "<tool_response> </tool_response> XML tags. Here are the available tools:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, give a JSON object that follows this pydantic model's JSON schema:\n"
    + FUNCTION_CALL_SCHEMA.replace("{", "{{").replace("}", "}}") + "\n"
    "Put each function call inside <tool_call> </tool_call> XML tags.\n"
    "Example:\n<tool_call>\n{{'name': <function-name>,'arguments': <args-dict>}}\n</tool_call>"
)

_SCRATCHPAD = re.compile(r"<(/?)REASONING_SCRATCHPAD>")
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.S)
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_TOOL_RESPONSE = re.compile(r"^<tool_response>\n(.*)\n</tool_response>$", re.S)
_LEADING_THINK = re.compile(r"\s*<think>(.*?)</think>\s*(.*)", re.S)


# --- rendering: messages → turns -----------------------------------------------------------------
def system_value(schemas: list[dict[str, Any]]) -> str:
    # "required": null beside the parameters, as the Hermes Agent lists each tool
    specs = [{"name": s["function"]["name"], "description": s["function"]["description"],
              "parameters": s["function"]["parameters"], "required": None} for s in schemas]
    return HERMES_SYSTEM_TEMPLATE.format(tools=json.dumps(specs, ensure_ascii=False))


def _parsed_arguments(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, AttributeError):
        return {}
    return value if isinstance(value, dict) else {}


def gpt_value(message: dict[str, Any]) -> str:
    """Hermes text for an assistant turn: always a <think> block, then the content, then the calls."""
    content = _SCRATCHPAD.sub(lambda m: f"<{m.group(1)}think>", message.get("content") or "")
    parts = []
    if message.get("reasoning"):
        parts.append(f"<think>\n{message['reasoning'].strip()}\n</think>")
    elif "<think>" not in content:
        parts.append("<think>\n</think>")
    if content.strip():
        parts.append(content.strip())
    for call in message.get("tool_calls") or []:
        body = json.dumps({"name": call["name"], "arguments": _parsed_arguments(call["arguments"])}, ensure_ascii=False)
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts)


def tool_value(message: dict[str, Any]) -> str:
    content: Any = message["content"]
    if message.get("structured"):  # the tool's own JSON: an object in the Hermes body
        content = json.loads(content)
    body = {"tool_call_id": message["tool_call_id"], "name": message["name"], "content": content}
    return f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>"


def turn(frm: str, value: str, content: str | None, **parts: Any) -> dict[str, Any]:
    return {**dict.fromkeys(TURN_KEYS), "from": frm, "value": value, "content": content, **parts}


def conversation(transcript: list[dict[str, Any]], system_prompt: str, schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ShareGPT turns of an agent's messages: the results of one reply's calls are one tool turn."""
    turns = [turn("system", system_value(schemas), system_prompt)]
    for m in transcript:
        if m["role"] == "user":
            turns.append(turn("human", m["content"], m["content"]))
        elif m["role"] == "assistant":
            calls = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in m["tool_calls"]]
            details = m.get("reasoning_details")
            # reasoning_details as JSON text: its entries vary in shape by provider, which one Arrow schema cannot hold
            turns.append(turn("gpt", gpt_value(m), m["content"] or "", reasoning=m.get("reasoning"),
                              tool_calls=calls or None,
                              reasoning_details=json.dumps(details, ensure_ascii=False) if details else None))
        elif m["role"] == "tool":
            images = [{**ref(i.data, i.mime), "shown": bool(m.get("shown"))} for i in m.get("images") or ()]
            result = {"tool_call_id": m["tool_call_id"], "name": m["name"], "content": m["content"],
                      "images": images or None}
            if turns[-1]["from"] == "tool":  # another call of the same reply
                turns[-1]["value"] += "\n" + tool_value(m)
                turns[-1]["tool_results"].append(result)
            else:
                turns.append(turn("tool", tool_value(m), None, tool_results=[result]))
    return turns


# --- reading back: a record → messages ------------------------------------------------------------
def offered_tools(rec: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The function schemas the record's system turn lists (what that prompt was offered), or None."""
    turns = rec.get("conversations") or []
    if not turns or turns[0].get("from") != "system":
        return None
    m = _TOOLS.search(turns[0].get("value") or "")
    if not m:
        return None
    try:
        specs = json.loads(m.group(1))
    except ValueError:
        return None
    # the listing's "required": null (the Hermes Agent's) is no part of a function schema
    return [{"type": "function", "function": {k: v for k, v in s.items() if not (k == "required" and v is None)}}
            for s in specs if isinstance(s, dict)]


def legacy_turns(rec: dict[str, Any]) -> bool:
    """Written before turns kept their message (`content`): read back from Hermes text."""
    return any("content" not in t for t in rec.get("conversations") or [])


def _message(role: str, content: str, *, reasoning: str | None = None, calls: Any = None,
             tool_call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    return {"role": role, "content": content, "reasoning_content": reasoning, "tool_calls": calls,
            "tool_call_id": tool_call_id, "name": name}


def assistant_message(t: dict[str, Any]) -> dict[str, Any]:
    calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c.get("arguments") or "{}"}}
             for c in t.get("tool_calls") or []] or None
    if "content" not in t:  # legacy: the calls are in tool_calls; the text is the Hermes value without them
        value = t.get("value") or ""
        thoughts = [x.strip() for x in _THINK.findall(value)]
        return _message("assistant", _TOOL_CALL.sub("", _THINK.sub("", value)).strip(),
                        reasoning="\n\n".join(x for x in thoughts if x) or None, calls=calls)
    content = t["content"] or ""
    if t.get("reasoning"):
        return _message("assistant", content, reasoning=t["reasoning"], calls=calls)
    # a model that thinks in its text opens its reply with the block: that, and only that, is its reasoning
    opened = _LEADING_THINK.match(_SCRATCHPAD.sub(lambda m: f"<{m.group(1)}think>", content))
    if opened:
        return _message("assistant", opened.group(2), reasoning=opened.group(1).strip() or None, calls=calls)
    return _message("assistant", content, calls=calls)


def tool_text(t: dict[str, Any]) -> str:
    """What the tool returned, as the model read it."""
    if "content" in t:
        return t["content"] or ""
    value = t.get("value") or ""
    m = _TOOL_RESPONSE.match(value)
    if not m:
        return value
    try:
        content: Any = json.loads(m.group(1)).get("content", value)
    except (ValueError, AttributeError):
        return m.group(1)
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def tool_results(t: dict[str, Any]) -> list[dict[str, Any]]:
    """A tool turn's results, each `{tool_call_id, name, content, images}`, whatever format wrote it."""
    if isinstance(t.get("tool_results"), list):
        return t["tool_results"]
    return [{"tool_call_id": t.get("tool_call_id"), "name": t.get("name"), "content": tool_text(t),
             "images": t.get("images")}]


def messages(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's conversation as chat messages: the system prompt the model was sent (the system
    turn's `content`; its `value`, the tool listing, a chat template writes again from the tools),
    then the turns (a tool turn gives a message per result)."""
    return [m for t in rec.get("conversations") or [] for m in _messages_of(t)]


def message_turns(rec: dict[str, Any]) -> list[int]:
    """For each of `messages(rec)`, the index of the turn it was read from."""
    return [i for i, t in enumerate(rec.get("conversations") or []) for _ in _messages_of(t)]


def _messages_of(t: dict[str, Any]) -> list[dict[str, Any]]:
    kind = t.get("from")
    if kind == "system" and isinstance(t.get("content"), str) and t["content"].strip():
        return [_message("system", t["content"])]
    if kind == "human":
        return [_message("user", (t.get("content") if "content" in t else t.get("value")) or "")]
    if kind == "gpt":
        return [assistant_message(t)]
    if kind == "tool":
        return [_message("tool", r.get("content") or "", tool_call_id=r.get("tool_call_id"), name=r.get("name"))
                for r in tool_results(t)]
    return []
