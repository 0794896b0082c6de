"""A record as an ATIF document (the Agent Trajectory Interchange Format of Harbor and its
ecosystem), for `export --format=atif`: one JSON file per trajectory, checked against the `atif`
package's own models before it is written.

    system step     the system prompt the model was sent
    user step       the prompt
    agent steps     one per model reply: its text, `reasoning_content`, `tool_calls` (arguments
                    as an object), the results of those calls as its `observation` (paired by
                    call id), and `metrics` (tokens, cached tokens) from the reply's own call;
                    with --tokens=exact, its prompt and completion token ids and log-probabilities
    final_metrics   the trajectory's tokens, cached tokens and cost, its step count
    extra           the verdict of the row's checks, the prompt and sample, stop reason, dataset fields
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .. import __version__
from ..record import assistant_message, messages, offered_tools, prompt_id_of, sample_number
from ..tokens import TokenTrace
from .options import verdict_of
from .rows import Rows

SCHEMA_VERSION = "ATIF-v1.8"


def atif_document(rec: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """The record as an ATIF trajectory, validated by the `atif` models (ValueError when not)."""
    import atif

    meta = rec.get("metadata") or {}
    turns = rec.get("conversations") or []
    system = next((t for t in turns if t.get("from") == "system"), None)
    steps: list[dict[str, Any]] = []
    if system is not None:
        steps.append({"source": "system", "message": system.get("content") or system.get("value") or ""})
    calls = iter(meta.get("llm_calls") or [])
    results = {m["tool_call_id"]: m for m in messages(rec) if m["role"] == "tool"}
    trace = TokenTrace.read(rec["tokens"]) if rec.get("tokens") else None  # ValueError: the row is left out, said
    replies = 0
    for t in turns:
        kind = t.get("from")
        if kind == "human":
            steps.append({"source": "user", "message": t.get("content") if "content" in t else t.get("value") or ""})
        elif kind == "gpt":
            step = _agent_step(assistant_message(t), next(calls, {}), results, meta.get("model"))
            if trace is not None and replies < len(trace.calls):  # the ids of that model call (ATIF v1.3+)
                step.setdefault("metrics", {}).update(_token_metrics(trace, replies))
            replies += 1
            steps.append(step)
    for number, step in enumerate(steps, start=1):
        step["step_id"] = number
    usage = meta.get("usage") or {}
    document = {
        "schema_version": SCHEMA_VERSION,
        "session_id": prompt_id_of(rec),
        "trajectory_id": rec["id"],
        "agent": {"name": "hermes-batch", "version": __version__, "model_name": meta.get("model"),
                  "tool_definitions": offered_tools(rec) or [],
                  "extra": {"backend": meta.get("backend"), "toolsets": rec.get("toolsets_used")}},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": usage.get("prompt_tokens"),
                          "total_completion_tokens": usage.get("completion_tokens"),
                          "total_cached_tokens": usage.get("cached_tokens"),
                          "total_cost_usd": usage.get("cost"), "total_steps": len(steps)},
        "extra": {"verification": verdict, "prompt_id": prompt_id_of(rec),
                  "sample": sample_number(rec), "prompt_index": rec.get("prompt_index"),
                  "completed": rec.get("completed"), "stop_reason": meta.get("stop_reason"),
                  "dataset": meta.get("dataset"), "run_name": meta.get("run_name"),
                  **({"cleaning": meta["cleaning"]} if meta.get("cleaning") else {})},
    }
    return atif.Trajectory.model_validate(document).to_json_dict()


def _agent_step(m: dict[str, Any], call: dict[str, Any], results: dict[str, dict[str, Any]],
                model: str | None) -> dict[str, Any]:
    step: dict[str, Any] = {"source": "agent", "message": m["content"] or "", "model_name": model,
                            "reasoning_content": m["reasoning_content"] or None}
    if m["tool_calls"]:
        step["tool_calls"] = [{"tool_call_id": c["id"], "function_name": c["function"]["name"],
                               "arguments": _arguments(c["function"]["arguments"])} for c in m["tool_calls"]]
        step["observation"] = {"results": [
            {"source_call_id": c["id"], "content": results[c["id"]]["content"]}
            for c in m["tool_calls"] if c["id"] in results]}
    metrics = {k: call.get(k) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")
               if call.get(k) is not None}
    if metrics:
        step["metrics"] = metrics
    return step


def _token_metrics(trace: TokenTrace, index: int) -> dict[str, Any]:
    call = trace.calls[index]
    metrics: dict[str, Any] = {}
    if (prompt := trace.prompt_of(index)) is not None:  # --tokens=record: what the endpoint gave
        metrics["prompt_token_ids"] = prompt
    if call.completion is not None:
        metrics["completion_token_ids"] = call.completion
    if (call.completion is not None or call.logprobs) and not any(math.isnan(lp) for lp in call.logprobs):  # a gap: no JSON number
        metrics["logprobs"] = call.logprobs
    return metrics


def _arguments(text: str) -> dict[str, Any]:
    """ATIF wants an object: arguments that are not one (a model's malformed call) are kept as text."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"_unparsed": text}
    return value if isinstance(value, dict) else {"_unparsed": text}


def write(rows: Rows, output: Path) -> None:
    """One document per trajectory in `output`, each validated; one that is not valid is left out, said."""
    output.mkdir(parents=True, exist_ok=True)
    for rec, _ in rows.named():
        try:
            document = atif_document(rec, verdict_of(rec))
        except ValueError as exc:  # pydantic's ValidationError is one
            rows.left_out(rec["id"], f"not a valid ATIF document: {exc}")
            continue
        path = output / f"{rec['id']}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")
        tmp.replace(path)
