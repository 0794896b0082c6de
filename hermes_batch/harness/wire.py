"""What every API the interception endpoint speaks comes down to: one call in Chat Completions'
terms (`Ask`: the messages, tools and tool choice the run's model client takes; what the harness
asked that the run decides instead), and server-sent events to stream the reply back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class Refused(ValueError):
    """A request the endpoint cannot take as it is (HTTP 400, with this message)."""


@dataclass
class Ask:
    messages: list[dict[str, Any]]  # Chat Completions messages, as the run's model client sends them
    tools: list[dict[str, Any]]  # Chat Completions function tools
    tool_choice: Any = None  # None: the model's choice ("auto")
    asked: dict[str, Any] = field(default_factory=dict)  # the harness's own settings the run overrode
    stream: bool = False


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
