"""A harness's trajectory, rebuilt from the model calls it made through the interception endpoint:
what the model saw. The conversation is the last answered call's messages (the harness's own
system prompt apart) and its reply; every call's spend is kept; a call whose history is not the
one before it extended (a harness that compacted, summarised or ran a side thread) is counted as a
new thread of the record."""

from __future__ import annotations

import json
from typing import Any

from ..record import AgentRun, ToolOutcome
from .intercept import Call


def fill(run: AgentRun, calls: list[Call]) -> tuple[str, list[dict[str, Any]]]:
    """`run` filled from `calls`; (the system prompt the harness sent, the tools it offered)."""
    answered = [c for c in calls if c.reply is not None]
    run.calls = [{"finish_reason": c.reply.finish_reason if c.reply else "error", "latency": round(c.seconds, 4),
                  **(c.reply.usage if c.reply else {}), **({"error": c.error} if c.error else {}),
                  **({"asked": c.asked} if c.asked else {})} for c in calls]
    run.llm_seconds = sum(c.seconds for c in calls)
    if not answered:
        return "", []
    last = answered[-1]
    system = "\n\n".join(_text(m.get("content")) for m in last.messages if m.get("role") == "system")
    transcript = [_turn(m) for m in last.messages if m.get("role") in ("user", "assistant", "tool")]
    reply = last.reply
    assert reply is not None
    transcript.append({"role": "assistant", "content": reply.content, "reasoning": reply.reasoning,
                       "tool_calls": reply.tool_calls, "finish_reason": reply.finish_reason,
                       "reasoning_details": reply.reasoning_details})
    run.transcript = transcript
    names = {c["id"]: c["name"] for m in transcript if m["role"] == "assistant" for c in m["tool_calls"] or []}
    for m in transcript:
        if m["role"] == "tool":
            cid = m["tool_call_id"]
            run.outcomes[cid] = ToolOutcome(cid, m.get("name") or names.get(cid, "?"), not _failed(m["content"]),
                                            cid in names, m["content"], 0.0)
    if reply.tool_calls:
        run.stop_reason = "harness_stopped"  # it asked for tools and called the model no more (its own limit)
        run.drop_unanswered_turn()
    elif reply.finish_reason == "length":
        run.stop_reason = "length"
    else:
        run.stop_reason = "final_answer" if (reply.content or "").strip() else "empty_response"
    return system, last.tools


def threads(calls: list[Call]) -> int:
    """How many threads of calls: a call whose messages do not begin with the previous call's starts
    a new one (the harness compacted or summarised its history, or held a side conversation)."""
    count, before = 0, None
    for c in calls:
        if c.reply is None:
            continue
        if before is None or c.messages[:len(before)] != before:
            count += 1
        before = c.messages
    return count


def _turn(m: dict[str, Any]) -> dict[str, Any]:
    role = m["role"]
    if role == "assistant":
        calls = [{"id": c.get("id") or "", "name": (c.get("function") or {}).get("name") or "",
                  "arguments": _arguments((c.get("function") or {}).get("arguments"))}
                 for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        return {"role": "assistant", "content": _text(m.get("content")),
                "reasoning": m.get("reasoning_content") or m.get("reasoning"), "tool_calls": calls,
                "finish_reason": "tool_calls" if calls else "stop", "reasoning_details": m.get("reasoning_details")}
    if role == "tool":
        return {"role": "tool", "tool_call_id": m.get("tool_call_id") or "", "name": m.get("name"),
                "content": _text(m.get("content")), "structured": False, "images": (), "shown": False}
    return {"role": "user", "content": _text(m.get("content"))}


def _text(content: Any) -> str:
    """A message's text, whether a string or parts."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {}, ensure_ascii=False)


def _failed(content: str) -> bool:
    """A harness's tool result read as a failure: its text says Error, or its JSON carries an error."""
    text = content.strip()
    if text.lower().startswith("error"):
        return True
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and bool(value.get("error")) and not value.get("success", False)
