"""Prompt caching: breakpoints only on the requests of models that need them, and cached tokens
recorded per call and per trajectory, in the statistics, and in the cost when the endpoint
reports none."""

from __future__ import annotations

import json
import os

import pytest

from hermes_batch.llm.caching import priced, read_prices, with_breakpoints
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script

LONG = script({"calls": [["terminal", {"command": "echo one"}]]}, {"calls": [["terminal", {"command": "echo two"}]]},
              {"answer": "done: {last_tool}"}, text="Run two commands. " + "Context. " * 200)


def marks(message: dict) -> int:
    content = message.get("content")
    return sum("cache_control" in p for p in content) if isinstance(content, list) else 0


def test_breakpoints_go_on_the_system_prompt_and_the_last_three_messages_with_text():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
                {"role": "tool", "tool_call_id": "a", "content": "out"},
                {"role": "assistant", "content": "more"},
                {"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "x"}, {"type": "image_url"}]}]
    sent = with_breakpoints(messages)
    assert [marks(m) for m in sent] == [1, 0, 0, 1, 1, 1]  # the empty reply has no text to mark
    assert sent[5]["content"][1]["cache_control"] == {"type": "ephemeral"} and "cache_control" not in sent[5]["content"][2]
    assert messages[0] == {"role": "system", "content": "sys"} and isinstance(messages[3]["content"], str)  # untouched
    assert read_prices("3,15") == (3.0, 15.0, 3.0) and read_prices("3, 15, 0.3") == (3.0, 15.0, 0.3)
    assert priced({"prompt_tokens": 1000, "cached_tokens": 800, "completion_tokens": 100}, (3, 15, 0.3)) == \
        pytest.approx((200 * 3 + 100 * 15 + 800 * 0.3) / 1e6)
    for bad in ("3", "a,b", "-1,2", "1,2,3,4"):
        with pytest.raises(ValueError):
            read_prices(bad)


def run(tmp_path, model_name: str, **flags) -> tuple[list[dict], dict, list[dict]]:
    with ScriptedModel(prompt_cache=True) as model:
        cli = CLI(tmp_path, model)
        res = cli.run("c", write_jsonl(tmp_path / "d.jsonl", [{"prompt": LONG}]), model=model_name,
                      toolsets="terminal", **flags)
        assert res.returncode == 0, res.stderr[-3000:]
        bodies = [r for r in model.requests if "messages" in r]
    records = read_jsonl(cli.run_dir("c") / "trajectories.jsonl")
    return bodies, json.loads((cli.run_dir("c") / "statistics.json").read_text()), records


def test_an_anthropic_model_gets_breakpoints_and_its_cached_tokens_are_counted(tmp_path):
    bodies, stats, [rec] = run(tmp_path, "anthropic/claude-test")
    assert len(bodies) == 3
    for body in bodies:
        counts = [marks(m) for m in body["messages"]]
        assert counts[0] == 1 and sum(counts) <= 4, counts  # the system prompt, and Anthropic's limit of four
        texts = [i for i, m in enumerate(body["messages"]) if m["role"] != "system" and m.get("content")]
        assert [counts[i] for i in texts[-3:]] == [1] * len(texts[-3:])
    calls = rec["metadata"]["llm_calls"]
    assert calls[0]["cached_tokens"] == 0 and calls[1]["cached_tokens"] > 0 and calls[2]["cached_tokens"] > 0
    assert rec["metadata"]["usage"]["cached_tokens"] == sum(c["cached_tokens"] for c in calls)
    assert stats["tokens"]["cached"] == rec["metadata"]["usage"]["cached_tokens"]
    assert stats["tokens"]["cache_hit_rate"] == round(stats["tokens"]["cached"] / stats["tokens"]["prompt"], 4) > 0
    assert "cache_control" not in json.dumps(rec["conversations"])  # the markers are the request's, never the data's


def test_other_models_go_out_unchanged_and_still_report_what_their_cache_served(tmp_path):
    bodies, stats, [rec] = run(tmp_path, "openai/gpt-test")
    assert all(isinstance(m.get("content"), (str, type(None))) for b in bodies for m in b["messages"])
    assert rec["metadata"]["usage"]["cached_tokens"] > 0 and stats["tokens"]["cached"] > 0
    (tmp_path / "off").mkdir()
    off, _, [plain] = run(tmp_path / "off", "anthropic/claude-test", prompt_caching="off")
    assert not any(marks(m) for b in off for m in b["messages"])
    assert plain["metadata"]["usage"]["cached_tokens"] == 0  # no breakpoint: Anthropic caches nothing


def test_token_prices_give_the_cost_the_endpoint_does_not(tmp_path):
    _, stats, [rec] = run(tmp_path, "openai/gpt-test", token_prices="3,15,0.3")
    expected = sum(priced(c, (3, 15, 0.3)) for c in rec["metadata"]["llm_calls"])
    assert rec["metadata"]["usage"]["cost"] == pytest.approx(expected) and stats["tokens"]["cost"] == pytest.approx(expected, abs=1e-6)
    cheaper = sum(priced({**c, "cached_tokens": 0}, (3, 15, 0.3)) for c in rec["metadata"]["llm_calls"])
    assert expected < cheaper  # the cached part at its own price


@pytest.mark.skipif(not (os.environ.get("HERMES_BATCH_REAL_CACHE") and os.environ.get("OPENROUTER_API_KEY")),
                    reason="opt-in: set HERMES_BATCH_REAL_CACHE=1 and OPENROUTER_API_KEY to check caching against "
                           "a real Anthropic model on OpenRouter")
def test_a_real_anthropic_model_serves_the_marked_prefix_from_its_cache(tmp_path):
    cli = CLI(tmp_path, None)
    res = cli.run("real", write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Run `echo one`, then `echo two`, then say done. "
                                                                        + "Context. " * 400}]),
                  model=os.environ.get("HERMES_BATCH_REAL_CACHE_MODEL", "anthropic/claude-haiku-4.5"),
                  api_key=os.environ["OPENROUTER_API_KEY"], toolsets="terminal", require_reasoning=False, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [rec] = read_jsonl(cli.run_dir("real") / "trajectories.jsonl")
    assert any(c["cached_tokens"] for c in rec["metadata"]["llm_calls"][1:]), rec["metadata"]["llm_calls"]
