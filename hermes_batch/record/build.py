"""Turns an agent run into the output record: its conversation (record/conversation.py), plus stats.

Every record has the same keys (tool stats padded to every known tool, absent values as null),
so `trajectories.jsonl` loads as one table in Hugging Face `datasets`.
"""

from __future__ import annotations

from typing import Any

from ..tools import ALL_TOOL_NAMES, Tool, openai_schema
from .conversation import conversation
from .fabrication import fabricated_replies
from .outcome import record_timestamp
from .reference import REFERENCE_TOOL_NAMES
from .transcript import AgentRun, has_reasoning
from .version import FORMAT


def conversations(run: AgentRun, tools: list[Tool], system_prompt: str) -> list[dict[str, Any]]:
    """The record's turns of a run (the ephemeral part of the system prompt is never saved)."""
    return conversation(run.transcript, system_prompt, [openai_schema(t) for t in tools])


def tool_statistics(run: AgentRun, offered: list[Tool] | None = None) -> tuple[dict[str, dict[str, int]], dict[str, int], int]:
    """Every tool of the runner's, every other tool the prompt was offered (an MCP server's) and every
    tool of the Hermes Agent's (record/reference.py), zeros included."""
    names = list(dict.fromkeys([*ALL_TOOL_NAMES, *(t.name for t in offered or ()), *REFERENCE_TOOL_NAMES]))
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in names}
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


def side_token_calls(record: dict[str, Any]) -> set[int]:
    """The places in a record's token trace of its harness's side-thread calls: not the task's own
    turns (an aside, a summary, the history before a compaction)."""
    threads = ((record.get("metadata") or {}).get("harness") or {}).get("side_threads") or []
    return {i for t in threads for i in t.get("token_calls") or []}


def side_threads(run: AgentRun) -> list[dict[str, Any]]:
    """A harness's other threads of calls, each whole, in the record's own turns: which thread it
    followed, which of the prompt's calls (by place) are its, and which of its token trace's calls
    (`token_calls`, with --tokens=exact)."""
    return [{"thread": t["thread"], "follows": t["follows"], "calls": t["calls"],
             **({"token_calls": t["token_calls"]} if t.get("token_calls") else {}),
             "conversations": conversation(t["transcript"], t["system"], t["tools"])} for t in run.side_threads]


def usage_totals(calls: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cached_tokens": 0,
                              "cost": None}
    for c in calls:
        for k in ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens"):
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
    verification: dict[str, Any] | None = None,
    system_prompt: str,
    sample_of: tuple[str, int, int] | None = None,
) -> dict[str, Any]:
    """`context` holds run facts the loop does not know: backend, image, attempt, fingerprint, timings;
    `verification`, the verdict of the row's checks (checks/verdicts.py); `sample_of`, (the row's id, which
    sample this is, how many the run asked for) when `prompt_id` is a sample's (record/samples.py)."""
    stats, errors, unknown = tool_statistics(run, tools)
    assistant = run.assistant_turns()
    returned = {m["tool_call_id"]: m["content"] for m in run.transcript if m["role"] == "tool"}
    with_reasoning = sum(1 for m in assistant if has_reasoning(m))
    calls = [
        {"finish_reason": c.get("finish_reason"), "latency": c.get("latency"),
         "prompt_tokens": c.get("prompt_tokens"), "completion_tokens": c.get("completion_tokens"),
         "cached_tokens": c.get("cached_tokens")}
        for c in run.calls
    ]
    record = {
        "id": prompt_id,  # first, so a resume scan can find it cheaply
        "prompt_index": prompt_index,
        "prompt_id": sample_of[0] if sample_of else prompt_id,
        "sample": sample_of[1] if sample_of else 0,
        "samples": sample_of[2] if sample_of else 1,
        "conversations": conversations(run, tools, system_prompt),
        "metadata": {
            "batch_num": batch_num,
            "timestamp": record_timestamp(),
            "model": model,
            "stop_reason": run.stop_reason,
            "tools_offered": [t.name for t in tools],
            "unknown_tool_calls": unknown,
            "fabricated_tool_results": fabricated_replies((m.get("content") or "" for m in assistant), returned),
            "reasoning_turns": with_reasoning,
            "assistant_turns": len(assistant),
            "usage": usage_totals(run.calls),
            "llm_calls": calls,
            "llm_seconds": round(run.llm_seconds, 3),
            "tool_seconds": round(run.tool_seconds, 3),
            **({"harness": {**run.harness, "side_threads": side_threads(run)}} if run.harness else {}),
            "dataset": extra or None,
            **context,
        },
        "completed": run.completed,
        "partial": not run.completed,
        "verification": verification,
        "api_calls": run.api_calls,
        "toolsets_used": toolsets,
        "tool_stats": stats,
        "tool_error_counts": errors,
        "format": FORMAT,
    }
    if run.tokens is not None:  # --tokens=exact only: a chat run's records keep the reference's keys
        record["tokens"] = run.tokens.to_json()
    return record
