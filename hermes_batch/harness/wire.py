"""What every API the interception endpoint speaks comes down to: one call in Chat Completions'
terms (`Ask`: the messages, tools and tool choice the run's model client takes; what the harness
asked that the run decides instead; the images of its tool results), and server-sent events to
stream the reply back. A tool result's images are kept as every tool's are (tools/base.py `Image`,
named in the record by record/images.py) and shown to the model as the native loop shows them:
after the turn's tool messages, which hold text only (tools/base.py `showing`)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..tools.base import Image, ToolError, showing
from ..tools.media import as_image


class Refused(ValueError):
    """A request the endpoint cannot take as it is (HTTP 400, with this message)."""


@dataclass
class Ask:
    messages: list[dict[str, Any]]  # Chat Completions messages, as the run's model client sends them
    tools: list[dict[str, Any]]  # Chat Completions function tools
    tool_choice: Any = None  # None: the model's choice ("auto")
    asked: dict[str, Any] = field(default_factory=dict)  # the harness's own settings the run overrode
    stream: bool = False
    # each tool result's images, by the id of the call it answers: the record keeps them on the result
    images: dict[str, tuple[Image, ...]] = field(default_factory=dict)


# what a text or image block of an API comes down to: ("text", its text) or ("image", its URL)
Part = tuple[str, str]
_DATA_URL = re.compile(r"data:[\w/+.-]*(?:;[\w=-]+)*;base64,(.*)", re.S)


def content(parts: list[Part]) -> str | list[dict[str, Any]]:
    """A message's text and images as Chat Completions content: its text alone, else its parts."""
    if all(kind == "text" for kind, _ in parts):
        return "\n\n".join(text for _, text in parts)
    return [{"type": "text", "text": value} if kind == "text" else {"type": "image_url", "image_url": {"url": value}}
            for kind, value in parts]


def results(answers: list[tuple[str, list[Part]]], kept: dict[str, tuple[Image, ...]]) -> list[dict[str, Any]]:
    """One turn's tool results, (call id, parts) each, as Chat Completions messages: a tool message
    of each one's text (an image that cannot be kept named in it, with why), then the images, shown
    as the native loop shows its tools' (`showing`) and kept in `kept` by call id for the record."""
    messages: list[dict[str, Any]] = []
    shown: list[Image] = []
    for cid, parts in answers:
        texts: list[str] = []
        images: list[Image] = []
        for kind, value in parts:
            image = picture(value) if kind == "image" else value
            if isinstance(image, Image):
                images.append(image)
            else:
                texts.append(image)
        messages.append({"role": "tool", "tool_call_id": cid, "content": "\n\n".join(texts)})
        if images:
            kept[cid] = tuple(images)
            shown += images
    return [*messages, showing(shown)] if shown else messages


def picture(url: str) -> Image | str:
    """The image a tool result holds as a `data:` URL, checked as a tool's own are (tools/media.py),
    else a line saying why it was left out (the endpoint fetches no URL: an image must come as bytes)."""
    m = _DATA_URL.match(url)
    try:
        if m is None:
            raise ToolError(f"it is named ({url[:200]}), not sent as bytes, and the endpoint fetches nothing")
        return as_image(base64.b64decode(m.group(1), validate=True), "the image")
    except (ToolError, binascii.Error, ValueError) as exc:
        return f"[an image the harness sent was left out: {exc}]"


def arguments(text: str) -> dict[str, Any]:
    """A tool call's JSON arguments as an object (what the Messages API's `input` holds)."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"_raw": text}  # not JSON: kept whole, as the model wrote it
    return value if isinstance(value, dict) else {"_value": value}


def event(name: str | None, data: dict[str, Any]) -> bytes:
    """One server-sent event (`event:` named, as the Messages and Responses APIs name theirs)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def named(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tool message named after the call it answers (the APIs pair them by id alone)."""
    names: dict[str, str] = {}
    for m in messages:
        for c in m.get("tool_calls") or []:
            names[c["id"]] = c["function"]["name"]
        if m["role"] == "tool" and m["tool_call_id"] in names:
            m["name"] = names[m["tool_call_id"]]
    return messages
