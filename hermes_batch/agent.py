"""The agent loop: ask the model, run the tools it calls in the prompt's sandbox, repeat.

It ends on a final answer (a reply without tool calls), on `max_turns` model calls, or when the
model's reply is cut off. It never raises for the model's mistakes: an unknown tool or bad
argument JSON is answered with an error the model can read, and counted.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from .flags import flag
from .llm import ModelClient, PromptFailed
from .record.transcript import AgentRun, ToolOutcome, visible_text
from .tools import Tool, ToolContext, call_tool, openai_schema, tool_error
from .tools.base import showing
from .util import read_json_flag

# In the Hermes Agent's frame (who it is, then sections under `#` headings, paragraphs apart), in
# this product's words; its day-stamped last line is left out, so a prompt's record does not change
# with the date it ran on.
AGENT_SYSTEM_PROMPT = "\n\n".join((
    "You are a capable assistant that completes tasks by using the tools you are given. You are direct and "
    "careful: you check your work with the tools and say plainly what you could not do.",
    "# Finishing the job\n"
    "The task is done when a real result, backed by real tool output, is there: not a plan, a stub or a "
    "description of one. Run what you wrote and report what it returned.\n"
    "Tool results come only from the tools: never write a tool's output, or its response frame, yourself. If "
    "a tool fails and blocks the way, say so and try another way; an honest report of the blocker is "
    "better than an invented result.",
    "# Parallel tool calls\n"
    "When you need several things that do not depend on each other, ask for them together in one reply; "
    "make calls one at a time only when a later call needs an earlier call's result.",
    "# Your sandbox\n"
    "Tools run in a private sandbox; file paths are relative to its work directory. Finish with a clear "
    "final answer.",
))

def api_messages_for(prompt: str, system_prompt: str, prefill: list[dict[str, str]]) -> list[dict[str, Any]]:
    """What the model is sent first. The ephemeral prompt and prefill live here only, never in the saved data."""
    return [{"role": "system", "content": system_prompt}, *prefill, {"role": "user", "content": prompt}]


async def run_agent(
    prompt: str,
    tools: list[Tool],
    llm: ModelClient,
    ctx: ToolContext,
    *,
    max_turns: int,
    system_prompt: str = AGENT_SYSTEM_PROMPT,
    prefill: list[dict[str, str]] | None = None,
    first_tool_choice: str = "auto",
    run: AgentRun | None = None,
    seed: int | None = None,
    model: str | None = None,
) -> AgentRun:
    """Fills `run` (a new one if none is given, so a caller with a deadline keeps what was done);
    `model`: the served model to ask instead of the run's (a trainer's policy version)."""
    run = run if run is not None else AgentRun()
    run.transcript.append({"role": "user", "content": prompt})
    messages = api_messages_for(prompt, system_prompt, prefill or [])
    offered = {t.name: t for t in tools}
    schemas = [openai_schema(t) for t in tools]

    for turn in range(max_turns):
        try:
            # "required" makes the first reply a call of an offered tool (small models otherwise describe)
            reply = await llm.complete(messages, schemas, first_tool_choice if turn == 0 and first_tool_choice != "auto" else None,
                                       seed=seed, trace=run.tokens, model=model)
        except PromptFailed as exc:
            if exc.kind == "bad_request" and run.calls:
                # refused mid-way (context too long, 413, 422): the turns already paid for are kept
                run.stop_reason = "request_rejected"
                return run
            exc.calls = run.calls  # what was spent before it failed goes into the failure record
            raise
        run.llm_seconds += reply.latency
        run.calls.append({"finish_reason": reply.finish_reason, "latency": round(reply.latency, 4), **reply.usage})
        reply.tool_calls = _own_ids(reply.tool_calls, set(run.outcomes))
        assistant = {
            "role": "assistant", "content": reply.content, "reasoning": reply.reasoning,
            "tool_calls": reply.tool_calls, "finish_reason": reply.finish_reason,
            "reasoning_details": reply.reasoning_details,
        }
        run.transcript.append(assistant)
        messages.append(_for_api(assistant))

        if not reply.tool_calls:
            if reply.finish_reason == "length":
                run.stop_reason = "length"
            elif reply.finish_reason == "content_filter":
                run.stop_reason = "content_filter"
            elif not visible_text(reply.content):
                run.stop_reason = "empty_response"
            else:
                run.stop_reason = "final_answer"
            return run

        shown: list[Any] = []
        for call in reply.tool_calls:  # in order: a later call may depend on an earlier one's effect
            outcome = await _execute(call, offered, ctx)
            run.tool_seconds += outcome.duration
            run.outcomes[call["id"]] = outcome
            tool_message = {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": outcome.content}
            run.transcript.append({**tool_message, "structured": outcome.structured, "images": outcome.images,
                                   "shown": outcome.shown})
            messages.append(tool_message)
            shown += outcome.images if outcome.shown else ()
        if shown:  # for a model that reads them itself (--vision_model=main)
            messages.append(showing(shown))
    run.stop_reason = "max_turns"
    return run


def _own_ids(calls: list[dict[str, Any]], used: set[str]) -> list[dict[str, Any]]:
    """Each call an id no other call of the trajectory has: results are paired by id, and some
    endpoints number every reply's calls from `call_0`."""
    out = []
    for call in calls:
        cid, n = call["id"], 1
        while cid in used:
            n += 1
            cid = f"{call['id']}~{n}"
        used.add(cid)
        out.append(call if cid == call["id"] else {**call, "id": cid})
    return out


async def _execute(call: dict[str, str], offered: dict[str, Tool], ctx: ToolContext) -> ToolOutcome:
    started = time.monotonic()
    tool = offered.get(call["name"])
    if tool is None:  # kept, answered and counted (the reference drops such a call and asks again)
        result = tool_error(f"there is no tool named {call['name']!r}; the tools are: {', '.join(offered)}")
    else:
        result = await call_tool(tool, call["arguments"], ctx)
    return ToolOutcome(call["id"], call["name"], result.ok, tool is not None, result.content, time.monotonic() - started,
                       result.structured, result.images, result.shown)


def _for_api(assistant: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": assistant["content"] or None}
    if assistant.get("reasoning_details"):  # providers that sign their thoughts want them back (OpenRouter)
        msg["reasoning_details"] = assistant["reasoning_details"]
    if assistant["tool_calls"]:
        msg["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _valid_json_object(c["arguments"])}}
            for c in assistant["tool_calls"]
        ]
    return msg


def _valid_json_object(arguments: str) -> str:
    """Some servers re-parse earlier tool calls and answer 400 to bad JSON; they get `{}` instead
    (the saved transcript keeps what the model really wrote, and the tool's error says why)."""
    try:
        return arguments if isinstance(json.loads(arguments), dict) else "{}"
    except (TypeError, ValueError):
        return "{}"


class PrefillMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class AgentSettings(BaseModel):
    """The loop's flags: how long it goes, and what it is told besides the prompt."""

    max_turns: int = flag(10, "model calls per prompt", ge=1)
    first_tool_choice: Literal["auto", "required"] = flag("auto", "tool_choice of a prompt's first request")
    ephemeral_system_prompt: str | None = flag(None, "appended to the system prompt at call time; never saved")
    prefill_messages_file: str | None = flag(None, "JSON array of {role, content} sent after the system prompt")
    prefill_messages: list[PrefillMessage] | None = None  # read from prefill_messages_file; not a flag
    prompt_timeout: float = flag(3600.0, "wall-clock seconds one prompt may take, all turns together", gt=0)

    @model_validator(mode="after")
    def _load_prefill(self) -> AgentSettings:
        if self.prefill_messages_file and self.prefill_messages is None:
            data = read_json_flag("prefill_messages_file", self.prefill_messages_file)
            if not isinstance(data, list):
                raise ValueError(f"prefill_messages_file {self.prefill_messages_file} must hold a JSON array of "
                                 "{role, content} objects")
            object.__setattr__(self, "prefill_messages", [PrefillMessage.model_validate(m) for m in data])
        return self
