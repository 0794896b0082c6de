"""Turns an agent run into the output record: ShareGPT conversations in Hermes format, plus stats.

Every record has the same keys (tool stats padded to every known tool, absent values as null),
so `trajectories.jsonl` loads as one table in Hugging Face `datasets`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .agent import AgentRun, has_reasoning
from .records import now_iso
from .tools import ALL_TOOL_NAMES, Tool, openai_schema

HERMES_SYSTEM_TEMPLATE = (
    "You are a function calling AI model. You are given function signatures inside <tools></tools> XML tags. "
    "You may call one or more functions to help with the user query. Do not make assumptions about what "
    "values to put into functions. After a function runs, its result comes back inside "
    "<tool_response></tool_response> XML tags. Here are the available tools:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a JSON object with the function name and arguments inside "
    "<tool_call></tool_call> XML tags, like this:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)

_SCRATCHPAD = re.compile(r"<(/?)REASONING_SCRATCHPAD>")


def system_turn(tools: list[Tool]) -> str:
    specs = [
        {"name": s["function"]["name"], "description": s["function"]["description"], "parameters": s["function"]["parameters"]}
        for s in (openai_schema(t) for t in tools)
    ]
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


def _tool_value(message: dict[str, Any]) -> str:
    content: Any = message["content"]
    try:
        content = json.loads(content)
    except (ValueError, TypeError):
        pass
    body = {"tool_call_id": message["tool_call_id"], "name": message["name"], "content": content}
    return f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>"


def conversations(run: AgentRun, tools: list[Tool]) -> list[dict[str, Any]]:
    """ShareGPT turns. Every turn has the same keys; tool turns pair with their call by id."""
    turns = [_turn("system", system_turn(tools))]
    for m in run.transcript:
        if m["role"] == "user":
            turns.append(_turn("human", m["content"]))
        elif m["role"] == "assistant":
            calls = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in m["tool_calls"]]
            details = m.get("reasoning_details")
            turns.append(_turn("gpt", gpt_value(m), tool_calls=calls or None,
                               reasoning_details=json.dumps(details, ensure_ascii=False) if details else None))
        elif m["role"] == "tool":
            turns.append(_turn("tool", _tool_value(m), name=m["name"], tool_call_id=m["tool_call_id"]))
    return turns


def _turn(frm: str, value: str, *, tool_calls=None, name=None, tool_call_id=None, reasoning_details=None) -> dict[str, Any]:
    # reasoning_details as JSON text: its entries vary in shape by provider, which one Arrow schema cannot hold
    return {"from": frm, "value": value, "tool_calls": tool_calls, "name": name, "tool_call_id": tool_call_id,
            "reasoning_details": reasoning_details}


def tool_statistics(run: AgentRun) -> tuple[dict[str, dict[str, int]], dict[str, int], int]:
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in ALL_TOOL_NAMES}
    unknown = 0
    for outcome in run.outcomes.values():
        if not outcome.known or outcome.name not in stats:
            unknown += 1
            continue
        s = stats[outcome.name]
        s["count"] += 1
        s["success" if outcome.ok else "failure"] += 1
    errors = {name: s["failure"] for name, s in stats.items()}
    return stats, errors, unknown


def usage_totals(calls: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cost": None}
    for c in calls:
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            totals[k] += int(c.get(k) or 0)
        if c.get("cost") is not None:
            totals["cost"] = (totals["cost"] or 0.0) + float(c["cost"])
    return totals


def build_record(
    *,
    prompt_id: str,
    prompt_index: int,
    batch_num: int,
    run: AgentRun,
    tools: list[Tool],
    toolsets: list[str],
    model: str,
    extra: dict[str, Any],
    context: dict[str, Any],
) -> dict[str, Any]:
    """`context` holds run facts the loop does not know: backend, image, attempt, fingerprint, timings."""
    stats, errors, unknown = tool_statistics(run)
    assistant = run.assistant_turns()
    with_reasoning = sum(1 for m in assistant if has_reasoning(m))
    calls = [
        {"finish_reason": c.get("finish_reason"), "latency": c.get("latency"),
         "prompt_tokens": c.get("prompt_tokens"), "completion_tokens": c.get("completion_tokens")}
        for c in run.calls
    ]
    return {
        "id": prompt_id,  # first, so a resume scan can find it cheaply
        "prompt_index": prompt_index,
        "conversations": conversations(run, tools),
        "metadata": {
            "batch_num": batch_num,
            "timestamp": now_iso(),
            "model": model,
            "stop_reason": run.stop_reason,
            "tools_offered": [t.name for t in tools],
            "unknown_tool_calls": unknown,
            "reasoning_turns": with_reasoning,
            "assistant_turns": len(assistant),
            "usage": usage_totals(run.calls),
            "llm_calls": calls,
            "llm_seconds": round(run.llm_seconds, 3),
            "tool_seconds": round(run.tool_seconds, 3),
            "dataset": extra or None,
            **context,
        },
        "completed": run.completed,
        "partial": not run.completed,
        "api_calls": run.api_calls,
        "toolsets_used": toolsets,
        "tool_stats": stats,
        "tool_error_counts": errors,
    }
