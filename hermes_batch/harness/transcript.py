"""A harness's trajectory, rebuilt from the model calls it made through the interception endpoint:
what the model saw. Calls fall into threads: a call whose history extends an earlier call's goes on
that call's thread; any other (a history the harness compacted or summarised, a subagent, a side
question) starts a thread of its own, linked to the thread of the call before it. The record's
conversation is the thread of the last answered call (its messages, the harness's own system prompt
apart, and its reply); every other thread is kept beside it, whole; every call's spend is kept. A
harness whose loop ends on a reply's tool calls (mini-swe-agent's submission) never sends their
results: its driver leaves them (`Ending`), and they answer them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..record import AgentRun, ToolOutcome
from ..tools.base import Image, showing
from .base import Ending
from .intercept import Call


def fill(run: AgentRun, calls: list[Call], ending: Ending | None = None) -> tuple[str, list[dict[str, Any]]]:
    """`run` filled from `calls` (and how the harness's loop ended, where its driver says so); (the
    system prompt the harness sent, the tools it offered)."""
    answered = [c for c in calls if c.reply is not None]
    run.calls = [{"finish_reason": c.reply.finish_reason if c.reply else "error", "latency": round(c.seconds, 4),
                  **(c.reply.usage if c.reply else {}), **({"error": c.error} if c.error else {}),
                  **({"asked": c.asked} if c.asked else {})} for c in calls]
    run.llm_seconds = sum(c.seconds for c in calls)
    if not answered:
        return "", []
    last = answered[-1]
    run.side_threads = [{"thread": n, "follows": t.follows, "calls": t.calls,
                         "token_calls": [calls[i].traced for i in t.calls if calls[i].traced is not None],
                         "system": _system(calls[t.calls[-1]]),
                         "transcript": _transcript(calls[t.calls[-1]]), "tools": calls[t.calls[-1]].tools}
                        for n, t in enumerate(split(calls)) if calls[t.calls[-1]] is not last]
    system = _system(last)
    transcript = run.transcript = _transcript(last)
    reply = last.reply
    assert reply is not None
    asked = {c["id"] for c in reply.tool_calls}
    if ending is not None and ending.finished and asked:
        # the harness's loop ended on this reply's calls (a submission): their results as it made
        # them, never sent, answer them in the record
        results: dict[str, dict[str, Any]] = {}
        for m in ending.unsent:
            if m.get("role") == "tool" and m.get("tool_call_id") in asked:
                results.setdefault(m["tool_call_id"], _turn(m))
        if results.keys() == asked:
            transcript += [results[cid] for cid in dict.fromkeys(c["id"] for c in reply.tool_calls)]
            asked = set()
    names = {c["id"]: c["name"] for m in transcript if m["role"] == "assistant" for c in m["tool_calls"] or []}
    for m in transcript:
        if m["role"] == "tool":
            cid = m["tool_call_id"]
            m["name"] = m.get("name") or names.get(cid)  # a harness that sends a result by its call's id alone
            run.outcomes[cid] = ToolOutcome(cid, m["name"] or "?", not _failed(m["content"]), cid in names,
                                            m["content"], 0.0, images=m["images"], shown=m["shown"])
    if ending is not None and not ending.finished:
        run.stop_reason = "harness_stopped"  # its own limit or error ended it, whatever its last reply was
        run.drop_unanswered_turn()
    elif asked:
        run.stop_reason = "harness_stopped"  # it asked for tools and called the model no more (its own limit)
        run.drop_unanswered_turn()
    elif reply.finish_reason == "length":
        run.stop_reason = "length"
    elif reply.tool_calls:
        run.stop_reason = "final_answer"  # its loop's own end (a submission), the calls' results kept
    else:
        run.stop_reason = "final_answer" if (reply.content or "").strip() else "empty_response"
    return system, last.tools


@dataclass
class Thread:
    calls: list[int]  # its answered calls, by their place among all the prompt's calls
    follows: int | None  # the thread of the call made just before its first (None: the first thread)


def split(calls: list[Call]) -> list[Thread]:
    """The answered calls' threads, in the order each began."""
    found: list[Thread] = []
    current: int | None = None
    for i, c in enumerate(calls):
        if c.reply is None:
            continue
        home = next((n for n in reversed(range(len(found)))
                     if _extends(c.messages, calls[found[n].calls[-1]].messages)), None)
        if home is None:
            found.append(Thread([], follows=current))
            home = len(found) - 1
        found[home].calls.append(i)
        current = home
    return found


def threads(calls: list[Call]) -> int:
    return len(split(calls))


def _extends(messages: list[dict[str, Any]], before: list[dict[str, Any]]) -> bool:
    return len(messages) > len(before) and messages[:len(before)] == before


def _system(call: Call) -> str:
    return "\n\n".join(_text(m.get("content")) for m in call.messages if m.get("role") == "system")


def _transcript(call: Call) -> list[dict[str, Any]]:
    """The messages a call sent (its system prompt apart) and the reply it got, as a transcript: the
    images of tool results on the results, as the native loop keeps them (the message that showed
    them to the model is the model's, not the data's)."""
    reply = call.reply
    assert reply is not None
    turns: list[dict[str, Any]] = []
    results: list[Image] = []  # the images of the tool results just before
    for m in call.messages:
        role = m.get("role")
        if role == "tool":
            results += call.images.get(m.get("tool_call_id") or "", ())
        elif results and m == showing(results):
            results = []
            continue
        else:
            results = []
        if role in ("user", "assistant", "tool"):
            turns.append(_turn(m, call.images))
    return [*turns,
            {"role": "assistant", "content": reply.content, "reasoning": reply.reasoning,
             "tool_calls": reply.tool_calls, "finish_reason": reply.finish_reason,
             "reasoning_details": reply.reasoning_details}]


def _turn(m: dict[str, Any], images: dict[str, tuple[Image, ...]] | None = None) -> dict[str, Any]:
    role = m["role"]
    if role == "assistant":
        calls = [{"id": c.get("id") or "", "name": (c.get("function") or {}).get("name") or "",
                  "arguments": _arguments((c.get("function") or {}).get("arguments"))}
                 for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        return {"role": "assistant", "content": _text(m.get("content")),
                "reasoning": m.get("reasoning_content") or m.get("reasoning"), "tool_calls": calls,
                "finish_reason": "tool_calls" if calls else "stop", "reasoning_details": m.get("reasoning_details")}
    if role == "tool":
        cid = m.get("tool_call_id") or ""
        shown = (images or {}).get(cid, ())
        return {"role": "tool", "tool_call_id": cid, "name": m.get("name"), "content": _text(m.get("content")),
                "structured": False, "images": shown, "shown": bool(shown)}
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
