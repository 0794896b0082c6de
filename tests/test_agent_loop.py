"""The agent loop over real HTTP: the scripted server, the real openai client, a local sandbox."""

from __future__ import annotations

import asyncio
import json

import pytest

from hermes_batch.agent import AGENT_SYSTEM_PROMPT, run_agent
from hermes_batch.backends import BackendSettings, SandboxSpec, load_backend
from hermes_batch.config import RunConfig
from hermes_batch.llm import FatalRunError, PromptFailed, open_client
from hermes_batch.record.build import build_record, conversations
from hermes_batch.tools import ToolContext, tools_for
from hermes_batch.util.limits import AdaptiveLimit
from tests.scripted_model import ScriptedModel, script


def agent(model: ScriptedModel, prompt: str, tmp_path, *, toolsets=("terminal", "file", "code"), max_turns=10,
          api_key="k", **config):
    cfg = RunConfig(run_name="t", model="scripted", base_url=model.base_url, **{"max_retries": 2, **config})

    async def main():
        backend = load_backend("local", BackendSettings(run_label="agent-test", sandbox_root=str(tmp_path)))
        await backend.setup()
        sandbox = await backend.start(SandboxSpec(prompt_id="p"))

        async def get():
            return sandbox

        llm = open_client(cfg.model_settings(), api_key, AdaptiveLimit(4))
        tools = tools_for(list(toolsets))
        try:
            run = await run_agent(prompt, tools, llm, ToolContext(get_sandbox=get), max_turns=max_turns,
                                  prefill=[m.model_dump() for m in cfg.prefill_messages or []],
                                  system_prompt="SYSTEM" + (f"\n\n{cfg.ephemeral_system_prompt}" if cfg.ephemeral_system_prompt else ""))
        finally:
            await llm.close()
            await sandbox.close()
        return run, tools

    return asyncio.run(main())


def test_several_calls_in_one_turn_are_one_tool_turn_paired_by_id(model, tmp_path):
    """As the Hermes Agent writes them: one tool turn holding every <tool_response> in call order, each
    result also kept as the model read it, paired with its call by id."""
    prompt = script(
        {"calls": [["write_file", {"path": "a.txt", "content": "alpha"}],
                   ["terminal", {"command": "cat a.txt"}],
                   ["read_file", {"path": "a.txt"}]]},
        {"answer": "The file says {last_tool}"},
    )
    run, tools = agent(model, prompt, tmp_path)
    assert run.stop_reason == "final_answer" and run.api_calls == 2
    turns = conversations(run, tools, AGENT_SYSTEM_PROMPT)
    assert [t["from"] for t in turns] == ["system", "human", "gpt", "tool", "gpt"]
    calls = turns[2]["tool_calls"]
    assert [c["name"] for c in calls] == ["write_file", "terminal", "read_file"]
    blocks = turns[3]["value"].split("\n</tool_response>\n<tool_response>\n")
    assert len(blocks) == 3 and turns[3]["value"].startswith("<tool_response>\n")
    bodies = [json.loads(b.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")) for b in blocks]
    results = turns[3]["tool_results"]
    for call, body, result in zip(calls, bodies, results, strict=True):
        assert body["tool_call_id"] == result["tool_call_id"] == call["id"]
        assert body["name"] == result["name"] == call["name"]
        assert body["content"] == json.loads(result["content"]) == json.loads(run.outcomes[call["id"]].content)
    assert bodies[1]["content"] == {"output": "alpha", "exit_code": 0, "error": None}
    assert turns[3]["content"] is None and turns[3]["tool_call_id"] is None
    assert turns[2]["value"].count("<tool_call>") == 3 and turns[2]["value"].startswith("<think>\nThinking")


def test_unknown_tools_and_bad_json_are_answered_not_fatal(model, tmp_path):
    prompt = script(
        {"calls": [["multiply", {"a": 2}], ["terminal", "{not json"], ["read_file", {"nope": 1}]]},
        {"answer": "{last_tool}"},
    )
    run, tools = agent(model, prompt, tmp_path)
    assert run.stop_reason == "final_answer"
    results = list(run.outcomes.values())
    assert [r.ok for r in results] == [False, False, False]
    assert "no tool named 'multiply'" in results[0].content and "terminal" in results[0].content
    assert "not valid JSON" in results[1].content
    assert "invalid arguments for read_file" in results[2].content and "path" in results[2].content
    # the model saw each error message as the tool result
    tool_messages = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [r.content for r in results]
    record = build_record(prompt_id="p", prompt_index=0, batch_num=0, run=run, tools=tools, toolsets=["terminal"],
                          system_prompt=AGENT_SYSTEM_PROMPT,
                          model="m", extra={}, context={})
    assert record["metadata"]["unknown_tool_calls"] == 1
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 0, "failure": 1}
    assert record["tool_error_counts"]["read_file"] == 1
    assert "multiply" not in record["tool_stats"]


def test_max_turns_ends_the_loop_and_marks_the_record(model, tmp_path):
    prompt = script(*[{"calls": [["terminal", {"command": f"echo {i}"}]]} for i in range(10)])
    run, tools = agent(model, prompt, tmp_path, max_turns=3)
    assert run.api_calls == 3 and run.stop_reason == "max_turns" and not run.completed
    record = build_record(prompt_id="p", prompt_index=0, batch_num=0, run=run, tools=tools, toolsets=["terminal"],
                          system_prompt=AGENT_SYSTEM_PROMPT,
                          model="m", extra={}, context={})
    assert record["completed"] is False and record["partial"] is True
    assert record["metadata"]["stop_reason"] == "max_turns"


def test_reasoning_is_captured_from_fields_and_tags(tmp_path):
    for mode, expect in (("field", "<think>\nPlan it.\n</think>"), ("think", "<think>Plan it.</think>")):
        m = ScriptedModel(reasoning=mode)
        m.start()
        try:
            run, tools = agent(m, script({"answer": "42", "reasoning": "Plan it."}), tmp_path)
        finally:
            m.stop()
        gpt = conversations(run, tools, AGENT_SYSTEM_PROMPT)[-1]["value"]
        assert gpt.startswith(expect) and gpt.endswith("42"), (mode, gpt)
    m = ScriptedModel(reasoning=None)
    m.start()
    try:
        run, tools = agent(m, script({"answer": "<REASONING_SCRATCHPAD>hmm</REASONING_SCRATCHPAD>42"}), tmp_path)
        plain, _ = agent(m, script({"answer": "42"}), tmp_path)
    finally:
        m.stop()
    assert conversations(run, tools, AGENT_SYSTEM_PROMPT)[-1]["value"] == "<think>hmm</think>42"  # the scratchpad becomes <think>
    from hermes_batch.record import has_reasoning

    assert has_reasoning(run.assistant_turns()[0])
    assert not has_reasoning(plain.assistant_turns()[0])
    assert conversations(plain, tools, AGENT_SYSTEM_PROMPT)[-1]["value"] == "<think>\n</think>\n42"  # every gpt turn has a think block


def test_usage_is_recorded_per_call(model, tmp_path):
    run, tools = agent(model, "plain prompt", tmp_path)
    assert run.api_calls == 2
    assert all(c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 for c in run.calls)
    assert [c["finish_reason"] for c in run.calls] == ["tool_calls", "stop"]
    record = build_record(prompt_id="p", prompt_index=0, batch_num=0, run=run, tools=tools, toolsets=["terminal"],
                          system_prompt=AGENT_SYSTEM_PROMPT,
                          model="m", extra={}, context={})
    usage = record["metadata"]["usage"]
    assert usage["total_tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"] for c in run.calls)


def test_ephemeral_prompt_and_prefill_reach_the_model_but_not_the_record(model, tmp_path):
    prefill = tmp_path / "prefill.json"
    prefill.write_text(json.dumps([{"role": "user", "content": "PREFILL-Q"}, {"role": "assistant", "content": "PREFILL-A"}]))
    run, tools = agent(model, script({"answer": "ok"}), tmp_path,
                       ephemeral_system_prompt="STEER-ME", prefill_messages_file=str(prefill))
    sent = model.requests[0]["messages"]
    assert "STEER-ME" in sent[0]["content"]
    assert [m["content"] for m in sent[1:3]] == ["PREFILL-Q", "PREFILL-A"]
    saved = json.dumps(conversations(run, tools, AGENT_SYSTEM_PROMPT))
    assert "STEER-ME" not in saved and "PREFILL" not in saved


def test_routing_reasoning_and_sampling_settings_go_in_the_request(model, tmp_path):
    agent(model, script({"answer": "ok"}), tmp_path, providers_allowed="a,b", providers_order=("b", "a"),
          provider_sort="price", reasoning_effort="high", max_tokens=123, temperature=0.5)
    body = model.requests[0]
    assert body["provider"] == {"only": ["a", "b"], "order": ["b", "a"], "sort": "price"}
    assert body["reasoning"] == {"enabled": True, "effort": "high"}
    assert body["max_tokens"] == 123 and body["temperature"] == 0.5
    assert model.headers[0]["Authorization"] == "Bearer k"
    agent(model, script({"answer": "ok"}), tmp_path, reasoning_effort="high", reasoning_disabled=True)
    assert model.requests[-1]["reasoning"] == {"effort": "none"}


def test_only_offered_tools_are_sent(model, tmp_path):
    agent(model, script({"answer": "ok"}), tmp_path, toolsets=("code",))
    names = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert names == ["sandbox", "session"]


def test_rate_limits_are_retried_after_retry_after(tmp_path):
    m = ScriptedModel(rate_limit_first=2, retry_after=0.3)
    m.start()
    try:
        run, _ = agent(m, script({"answer": "ok"}), tmp_path)
    finally:
        m.stop()
    assert run.completed and m.rate_limited == 2


def test_rejected_key_is_fatal(tmp_path):
    m = ScriptedModel(api_key="right")
    m.start()
    try:
        with pytest.raises(FatalRunError, match="rejected the API key"):
            agent(m, "x", tmp_path, api_key="wrong")
    finally:
        m.stop()


def test_dead_endpoint_fails_the_prompt_after_retries(tmp_path):
    dead = ScriptedModel()
    dead.base_url = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    with pytest.raises(PromptFailed) as err:
        agent(dead, "x", tmp_path, max_retries=1)
    assert err.value.kind == "endpoint_unreachable" and "127.0.0.1:9" in str(err.value)


def test_tool_calls_written_as_text_are_recovered(model, tmp_path):
    text_call = '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo from-text"}}\n</tool_call>'
    run, tools = agent(model, script({"content": f"Let me run it.\n{text_call}"}, {"answer": "{last_tool}"}), tmp_path)
    outcome = next(iter(run.outcomes.values()))
    assert outcome.name == "terminal" and "from-text" in outcome.content


@pytest.mark.parametrize("maximum", [1, 8])
def test_adaptive_limit_shrinks_on_rate_limits_and_recovers(maximum):
    async def main():
        limit = AdaptiveLimit(maximum, cooldown=0)
        for _ in range(3):
            limit.rate_limited()
        low = limit.limit
        for _ in range(200):
            limit.succeeded()
        return low, limit.limit

    low, high = asyncio.run(main())
    assert low == max(1, int(int(int(maximum * 0.8) * 0.8) * 0.8)) or low == 1
    assert high == maximum


def test_calls_written_in_text_are_recovered_but_not_from_thoughts_and_the_text_is_kept():
    """A Hermes model served without a tool parser writes its calls in the text. A call inside its
    <think> block was run, and the text after a call was lost."""
    from hermes_batch.tokens import tagged_calls

    call = '<tool_call>{"name": "terminal", "arguments": {"command": "echo hi"}}</tool_call>'
    content, calls = tagged_calls(f"I will run it: {call} and then report.")
    assert [c["name"] for c in calls] == ["terminal"] and content == "I will run it:  and then report."
    thought = f'<think>maybe {call.replace("hi", "no")}, no</think>The answer is 4.'
    assert tagged_calls(thought) == (thought, [])
