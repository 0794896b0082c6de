"""The interception endpoint speaks the APIs harnesses are written against: Anthropic's Messages
API and OpenAI's Responses API (streamed and not, a tool-use round trip), driven here by the real
`anthropic` and `openai` SDKs, and answered by the run's model client (the scripted model server
behind it): the run's model, --max_tokens and sampling whatever the client asked, each call kept
in Chat Completions' terms so the record is rebuilt from it, a wrong key refused."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from tests.scripted_model import ScriptedModel, script

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

TOOL = {"name": "write_file", "description": "Write a file.",
        "schema": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                   "required": ["path", "text"]}}
WRITTEN = '{"path":"out.txt","text":"42"}'  # as the model writes it: compact
FLOW = script({"calls": [["write_file", WRITTEN]]}, {"answer": "Wrote it: {last_tool}"}, text="Write 42 into out.txt.")


class Loopback:
    """Where the endpoint listens in this test: this machine's loopback (a sandbox's own, in a run)."""

    def __init__(self) -> None:
        self.port = 0

    async def listen(self, port: int) -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        return sock


def serve(model: ScriptedModel, test: Any) -> Any:
    """Run `test(line, base_url)` against an endpoint answered by a model client of the run's
    (--max_tokens=77, --temperature=0.3), itself at the scripted model server."""
    from hermes_batch.config import RunConfig
    from hermes_batch.harness import Intercept
    from hermes_batch.llm import open_client
    from hermes_batch.util.limits import AdaptiveLimit

    cfg = RunConfig(run_name="t", model="scripted", base_url=model.base_url, max_tokens=77, temperature=0.3,
                    max_retries=0)

    async def main() -> Any:
        llm = open_client(cfg.model_settings(), "k", AdaptiveLimit(4))
        where = Loopback()
        line = await Intercept(llm, 5, "scripted").open(where)  # type: ignore[arg-type]
        try:
            return await test(line, f"http://127.0.0.1:{where.port}")
        finally:
            await line.close()
            await llm.close()

    return asyncio.run(main())


def run_settings_held(model: ScriptedModel) -> None:
    """Every request the model server saw carried the run's model and settings, not the client's."""
    assert model.requests and all(r["model"] == "scripted" and r["max_tokens"] == 77 and r["temperature"] == 0.3
                                  for r in model.requests), model.requests


def paired(line: Any) -> None:
    """The last call, in Chat Completions' terms, and the record rebuilt from it: the system prompt
    as the client sent it, the tool call paired with its result by id."""
    from hermes_batch.harness import fill
    from hermes_batch.record import AgentRun

    messages = line.calls[-1].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    [call] = messages[2]["tool_calls"]
    assert messages[3]["tool_call_id"] == call["id"]
    assert call["function"]["arguments"] == WRITTEN  # sent back as an object, kept as the model wrote it
    run = AgentRun()
    system, offered = fill(run, line.calls)
    assert system == "You are a careful agent." and [t["function"]["name"] for t in offered] == ["write_file"]
    assert messages[3]["name"] == run.outcomes[call["id"]].name == "write_file" and run.stop_reason == "final_answer"
    assert run.transcript[-1]["content"] == "Wrote it: done: 2 bytes"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_the_anthropic_sdk_drives_a_tool_use_round_trip_through_the_endpoint(streamed):
    tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}]
    system = [{"type": "text", "text": "You are a careful agent."}]  # as blocks, as Claude Code sends it

    async def test(line: Any, base_url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=base_url, api_key=line.key, max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": FLOW}]
        thinking = {"type": "enabled", "budget_tokens": 1024}
        asked = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "thinking": thinking, "system": system,
                 "tools": tools}

        async def one() -> Any:
            if not streamed:
                return await client.messages.create(messages=messages, **asked)
            async with client.messages.stream(messages=messages, **asked) as stream:
                return await stream.get_final_message()

        first = await one()
        assert first.stop_reason == "tool_use" and first.model == "scripted"
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "write_file" and use.input == {"path": "out.txt", "text": "42"}
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": "done: 2 bytes"}]}]}]
        second = await one()
        assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["thinking", "text"]
        assert second.content[-1].text == "Wrote it: done: 2 bytes" and second.usage.output_tokens > 0
        refused = anthropic.AsyncAnthropic(base_url=base_url, api_key="hb-another-prompts-key", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            await refused.messages.create(messages=messages, **asked)
        await client.close()
        await refused.close()
        assert line.calls[0].asked == {"model": "claude-sonnet-4-5", "max_tokens": 4096, "thinking": thinking}
        assert line.calls[1].messages[2]["reasoning_content"] == "Thinking about step 1."  # its thinking, sent back
        paired(line)
        return len(line.calls)

    with ScriptedModel() as model:
        assert serve(model, test) == 2  # the refused call never reached the model
        run_settings_held(model)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_the_openai_sdk_drives_a_function_call_round_trip_through_the_responses_api(streamed):
    tools = [{"type": "function", "name": TOOL["name"], "description": TOOL["description"],
              "parameters": TOOL["schema"]}]

    async def test(line: Any, base_url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=line.key, max_retries=0)
        items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": FLOW}]}]
        asked = {"model": "gpt-5", "max_output_tokens": 4096, "instructions": "You are a careful agent.",
                 "tools": tools, "store": False}

        async def one() -> Any:
            if not streamed:
                return await client.responses.create(input=items, **asked)
            async with client.responses.stream(input=items, **asked) as stream:
                return await stream.get_final_response()

        first = await one()
        assert first.status == "completed" and first.model == "scripted"
        [call] = [o for o in first.output if o.type == "function_call"]
        assert call.name == "write_file" and json.loads(call.arguments) == {"path": "out.txt", "text": "42"}
        items += [o.model_dump(exclude_none=True) for o in first.output]  # its reasoning, the call, as Codex does
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "done: 2 bytes"})
        second = await one()
        assert second.output_text == "Wrote it: done: 2 bytes" and second.usage.output_tokens > 0
        refused = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="hb-another-prompts-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await refused.responses.create(input=items, **asked)
        await client.close()
        await refused.close()
        assert line.calls[0].asked == {"model": "gpt-5", "max_output_tokens": 4096}
        paired(line)
        return len(line.calls)

    with ScriptedModel() as model:
        assert serve(model, test) == 2
        run_settings_held(model)
