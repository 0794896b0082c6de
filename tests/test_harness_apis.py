"""The interception endpoint speaks the APIs harnesses are written against: Anthropic's Messages
API and OpenAI's Responses API (streamed and not, a tool-use round trip), driven here by the real
`anthropic` and `openai` SDKs, and answered by the run's model client (the scripted model server
behind it): the run's model, --max_tokens and sampling whatever the client asked, each call kept
in Chat Completions' terms so the record is rebuilt from it, a wrong key refused."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
from typing import Any

import pytest

from tests.media_doubles import png
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
        [thought] = [b for b in first.content if b.type == "thinking"]
        assert thought.signature.startswith("hermes-batch:")  # signed (streamed: its signature_delta), as the API's is
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
        assert "reasoning_details" not in line.calls[1].messages[2]  # under the endpoint's own signature
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


# --- what the translations carry: images in tool results, thinking and its signature ------------

PICTURE = png(4, 2, (200, 30, 30))
PICTURE_URL = "data:image/png;base64," + base64.b64encode(PICTURE).decode()
USE = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/work/pic.png"}}
CALL = {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": '{"path":"pic.png"}'}


def shown_and_kept(ask: Any, calls: list[str]) -> None:
    """The tool results reach the model as the native loop's do: tool messages of text alone, then
    one user message showing their images in order; each result's image is kept by its call id."""
    from hermes_batch.tools.base import Image

    *_, shown = ask.messages
    assert [m["role"] for m in ask.messages[-len(calls) - 1:]] == ["tool"] * len(calls) + ["user"]
    assert all(isinstance(m["content"], str) for m in ask.messages if m["role"] == "tool")
    assert shown["content"][0] == {"type": "text", "text": "The images of the tool results above, in order:"}
    assert [p["image_url"]["url"] for p in shown["content"][1:]] == [PICTURE_URL] * len(calls)
    assert ask.images == {cid: (Image(PICTURE, "image/png"),) for cid in calls}


def test_an_image_in_an_anthropic_tool_result_is_shown_to_the_model_and_kept():
    from hermes_batch.harness import messages_api

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PICTURE_URL.split(",")[1]}}
    second = {**USE, "id": "toolu_2"}
    ask = messages_api.ask({"messages": [
        {"role": "user", "content": "Look at pic.png."},
        {"role": "assistant", "content": [USE, second]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]},
                                     {"type": "tool_result", "tool_use_id": "toolu_2",
                                      "content": [{"type": "text", "text": "pic.png:"}, image]}]}]})
    shown_and_kept(ask, ["toolu_1", "toolu_2"])
    assert [m["content"] for m in ask.messages if m["role"] == "tool"] == ["", "pic.png:"]
    by_url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    broken = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}}
    ask = messages_api.ask({"messages": [
        {"role": "user", "content": "Look."}, {"role": "assistant", "content": [USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [by_url, broken]}]}]})
    [tool] = [m for m in ask.messages if m["role"] == "tool"]
    assert ask.messages[-1] is tool and not ask.images  # nothing to show, nothing kept: each said in its place
    assert tool["content"].count("[an image the harness sent was left out:") == 2
    assert "https://example.com/a.png" in tool["content"] and "is not an image" in tool["content"]


def test_an_image_in_a_responses_function_call_output_is_shown_to_the_model_and_kept():
    from hermes_batch.harness import responses_api

    output = [{"type": "input_image", "image_url": PICTURE_URL}]
    ask = responses_api.ask({"input": [
        {"role": "user", "content": "Look at pic.png."}, CALL, {**CALL, "call_id": "call_2"},
        {"type": "function_call_output", "call_id": "call_1", "output": output},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "pic.png:"},
                                                                          *output]}]})
    shown_and_kept(ask, ["call_1", "call_2"])
    assert [m["content"] for m in ask.messages if m["role"] == "tool"] == ["", "pic.png:"]


def test_the_record_keeps_a_tool_result_s_image_on_the_result_not_the_message_that_showed_it():
    from hermes_batch.harness import fill, responses_api
    from hermes_batch.harness.intercept import Call
    from hermes_batch.llm import Completion
    from hermes_batch.record import AgentRun, image_files
    from hermes_batch.record.conversation import conversation

    ask = responses_api.ask({"input": [
        {"role": "user", "content": "Look at pic.png."}, CALL,
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_image", "image_url": PICTURE_URL}]}]})
    run = AgentRun()
    fill(run, [Call(ask.messages, ask.tools, ask.asked, Completion("Red.", None, [], "stop"), images=ask.images)])
    assert [m["role"] for m in run.transcript] == ["user", "assistant", "tool", "assistant"]
    assert run.outcomes["call_1"].images == run.transcript[2]["images"] and run.outcomes["call_1"].shown
    [tool] = [t for t in conversation(run.transcript, "", []) if t["from"] == "tool"]
    digest = hashlib.sha256(PICTURE).hexdigest()
    assert tool["tool_results"][0]["images"] == [{"sha256": digest, "mime": "image/png", "bytes": len(PICTURE),
                                                  "shown": True}]
    assert image_files(run.transcript) == {f"images/{digest}.png": PICTURE}  # what the store writes


def test_thinking_comes_back_signed_and_redacted_thinking_is_kept_whole():
    from hermes_batch.harness import fill, messages_api
    from hermes_batch.harness.intercept import Call
    from hermes_batch.llm import Completion
    from hermes_batch.record import AgentRun

    [thinking, _] = messages_api.reply(Completion("Hi.", "Say hi.", [], "stop"), "m",
                                       {"thinking": {"type": "adaptive"}})["content"]
    assert thinking["signature"] and thinking["signature"] == messages_api.signature("Say hi.")  # as Claude Code needs
    ours = messages_api.ask({"messages": [{"role": "user", "content": "Hello."},
                                          {"role": "assistant", "content": [thinking, {"type": "text", "text": "Hi."}]},
                                          {"role": "user", "content": "Again."}]})
    assert ours.messages[1] == {"role": "assistant", "content": "Hi.", "reasoning_content": "Say hi."}  # as before
    foreign = [{"type": "thinking", "thinking": "Plan.", "signature": "EqQBCkgIBBAB"},
               {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}, {"type": "text", "text": "Done."}]
    theirs = messages_api.ask({"messages": [{"role": "user", "content": "Hello."},
                                            {"role": "assistant", "content": foreign}]})
    details = [{"type": "reasoning.text", "text": "Plan.", "signature": "EqQBCkgIBBAB", "format": "anthropic-claude-v1",
                "index": 0},
               {"type": "reasoning.encrypted", "data": "EmwKAhgBEgy3va3pzix", "format": "anthropic-claude-v1", "index": 1}]
    assert theirs.messages[1] == {"role": "assistant", "content": "Done.", "reasoning_content": "Plan.",
                                  "reasoning_details": details}
    run = AgentRun()
    fill(run, [Call(theirs.messages + [{"role": "user", "content": "Go on."}], [], {}, reply=Completion("Ok.", None, [], "stop"))])
    assert run.transcript[1]["reasoning_details"] == details  # the record keeps them


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_an_image_a_tool_gave_a_harness_reaches_the_model_and_the_record_through_the_sdks(api):
    from hermes_batch.harness import fill
    from hermes_batch.record import AgentRun

    async def test(line: Any, base_url: str) -> Any:
        if api == "messages":
            client: Any = anthropic.AsyncAnthropic(base_url=base_url, api_key=line.key, max_retries=0)
            tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}]
            messages: list[Any] = [{"role": "user", "content": FLOW}]
            first = await client.messages.create(model="claude", max_tokens=99, messages=messages, tools=tools)
            [use] = [b for b in first.content if b.type == "tool_use"]
            image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": PICTURE_URL.split(",")[1]}}
            messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [image]}]}]
            for _ in range(2):  # the second time, as a harness's retry sends it
                second = await client.messages.create(model="claude", max_tokens=99, messages=messages, tools=tools)
            answered, cid = second.stop_reason == "end_turn", use.id
        else:
            client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=line.key, max_retries=0)
            functions = [{"type": "function", "name": TOOL["name"], "description": TOOL["description"],
                          "parameters": TOOL["schema"]}]
            items: list[Any] = [{"role": "user", "content": FLOW}]
            first = await client.responses.create(model="gpt", input=items, tools=functions, store=False)
            [call] = [o for o in first.output if o.type == "function_call"]
            items += [o.model_dump(exclude_none=True) for o in first.output]
            items.append({"type": "function_call_output", "call_id": call.call_id,
                          "output": [{"type": "input_image", "image_url": PICTURE_URL}]})
            for _ in range(2):
                second = await client.responses.create(model="gpt", input=items, tools=functions, store=False)
            answered, cid = second.status == "completed", call.call_id
        await client.close()
        assert answered
        before, last = line.calls[-2:]  # each image once in memory, however often it is sent
        assert last.images[cid][0] is before.images[cid][0] and last.messages[-1] == before.messages[-1]
        assert last.messages[-1]["content"][1]["image_url"]["url"] is before.messages[-1]["content"][1]["image_url"]["url"]
        run = AgentRun()
        fill(run, line.calls)
        [tool] = [m for m in run.transcript if m["role"] == "tool"]
        return cid, tool

    with ScriptedModel() as model:
        cid, tool = serve(model, test)
    *_, result, shown = model.requests[-1]["messages"]  # what the model server was sent
    assert result == {"role": "tool", "tool_call_id": cid, "name": "write_file", "content": ""}
    assert shown["role"] == "user" and shown["content"][1] == {"type": "image_url", "image_url": {"url": PICTURE_URL}}
    assert tool["tool_call_id"] == cid and [i.data for i in tool["images"]] == [PICTURE] and tool["shown"]


def test_with_tokens_exact_a_history_holding_a_tool_result_s_image_is_refused_by_name():
    """--tokens=exact sends the model token ids only, as with --vision_model=main: the call is
    refused, saying why, rather than the image silently dropped."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PICTURE_URL.split(",")[1]}}
    history = [{"role": "user", "content": "Look at pic.png."}, {"role": "assistant", "content": [USE]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}]}]

    async def test(line: Any, base_url: str) -> Any:
        line.trace = object()  # the prompt's token trace
        client = anthropic.AsyncAnthropic(base_url=base_url, api_key=line.key, max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="--tokens=exact"):
            await client.messages.create(model="claude", max_tokens=99, messages=history)
        await client.close()
        return line.calls

    with ScriptedModel() as model:
        assert serve(model, test) == [] and model.requests == []
