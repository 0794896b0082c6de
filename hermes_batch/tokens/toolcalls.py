"""How models write tool calls in their text, read back client-side: a registry of formats, each a
function from a completion's text to (content, reasoning, calls). Token-exact runs parse what the
model generated themselves (the endpoint only returns tokens); chat endpoints served without a tool
parser are read with the same functions.

    hermes   Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, a
             leading `<think>…</think>` as reasoning; a reply that is nothing but such objects, or
             holds them in ```json fences (after words or not), is calls too when each names an
             offered tool and gives its `arguments` (or `parameters`), close to how llama.cpp's own
             parser reads them
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection

Call = dict[str, str]  # {id, name, arguments (JSON text)}

_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)", re.S)
_LEADING_THINK = re.compile(r"\s*<think>(.*?)</think>\s*", re.S)
_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.S)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(obj: object, names: Collection[str] | None = None) -> Call | None:
    """A call object; with `names` (an untagged object, which an answer in JSON could be too), only
    one that names an offered tool and gives its arguments."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and (obj["name"] not in names or not ({"arguments", "parameters"} & obj.keys())):
        return None
    args = obj.get("arguments", obj.get("parameters", {}) if names is not None else {})
    return {"id": new_call_id(), "name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}


def tagged_calls(content: str) -> tuple[str, list[Call]]:
    """`<tool_call>` blocks outside a `<think>` block (a call considered is not a call made); the
    text keeps all but the calls recovered."""
    visible = _THINK_BLOCK.sub(lambda m: " " * len(m.group(0)), content)  # the same offsets
    calls, spans = [], []
    for m in _TOOL_CALL_TAG.finditer(visible):
        try:
            call = _call(json.loads(m.group(1)))
        except json.JSONDecodeError:
            continue
        if call is not None:
            calls.append(call)
            spans.append(m.span())
    if not calls:
        return content, []
    kept, pos = [], 0
    for start, end in spans:
        kept.append(content[pos:start])
        pos = end
    kept.append(content[pos:])
    return "".join(kept).strip(), calls


def hermes(text: str, names: Collection[str] = ()) -> tuple[str, str | None, list[Call]]:
    """`names`: the tools offered (an untagged call must name one)."""
    reasoning = None
    opened = _LEADING_THINK.match(text)
    if opened:
        reasoning, text = opened.group(1).strip() or None, text[opened.end():]
    content, calls = tagged_calls(text)
    if not calls:  # the whole reply call objects, bare
        bare = _objects(text.strip(), names)
        if bare:
            content, calls = "", bare
    if not calls:  # call objects in ```json fences, after words or not
        kept, pos = [], 0
        for m in _FENCE.finditer(text):
            found = _objects(m.group(1).strip(), names)
            if found:
                calls += found
                kept.append(text[pos:m.start()])
                pos = m.end()
        if calls:
            content = "".join(kept) + text[pos:]
    return content.strip(), reasoning, calls


def _objects(body: str, names: Collection[str]) -> list[Call]:
    """Calls, when `body` is nothing but one or more call objects one after another."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return []
        call = _call(obj, names)
        if call is None:
            return []
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
    return calls


FORMATS: dict[str, Callable[[str, Collection[str]], tuple[str, str | None, list[Call]]]] = {"hermes": hermes}
