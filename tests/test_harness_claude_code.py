"""Claude Code, unmodified (`@anthropic-ai/claude-code` from the npm registry, its Linux executable
installed once into the user's cache), driving a prompt in print mode in the local jail, on Docker
and on Apptainer: its model calls reach the runner's interception endpoint as Anthropic's Messages
API and are answered by the scripted model server; the record is what its model saw."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CLI, read_jsonl, tool_results_in, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_harness import needs_harness


@pytest.mark.parametrize("backend", ["local", "docker", "singularity"])
def test_claude_code_drives_a_prompt_in_its_sandbox_and_the_record_holds_its_own_system_prompt(backend, tmp_path):
    on = needs_harness("claude-code", backend)
    flow = script({"calls": [["Bash", {"command": "echo 42 > out.txt", "description": "Write 42 into out.txt"}]]},
                  {"answer": "out.txt holds 42."}, text="Write 42 into out.txt.")
    rows = [{"prompt": flow, "check": 'test "$(cat out.txt)" = 42'}]
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("claude", write_jsonl(tmp_path / "d.jsonl", rows), require_reasoning=False, timeout=300, **on)
        sent = list(model.requests)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("claude") / "trajectories.jsonl")
    assert record["verification"]["status"] == "pass"  # what its Bash tool wrote is the sandbox's
    assert record["metadata"]["agent"] == "claude-code==2.1.332"
    assert record["metadata"]["harness"]["calls"] == len(sent) == 2, [m["messages"][-1] for m in sent]
    system = sent[0]["messages"][0]
    assert system["role"] == "system" and "Claude Code" in system["content"]  # its own, as it sent it
    assert record["conversations"][0]["content"] == system["content"]
    offered = {t["function"]["name"] for t in sent[0]["tools"]}
    assert {"Bash", "Read", "Write", "Edit"} <= offered and set(record["metadata"]["tools_offered"]) == offered
    [tool] = tool_results_in(record)
    assert tool["name"] == "Bash"
    assert record["conversations"][-1]["value"].endswith("out.txt holds 42.")
    assert json.dumps(record).count("hb-") == 0  # the prompt's key is not in its record


def test_claude_code_s_rollout_is_token_exact_through_the_messages_api(tmp_path):
    """--tokens=exact with Claude Code: its calls, in Anthropic's Messages API, rendered and
    tokenised by the runner; the history it sends back in Messages blocks (its tool call as an
    object, its thinking) renders as the model wrote it, so the record is one segment and the ids
    under the mask are the server's own."""
    from hermes_batch.tokens.trace import TokenTrace
    from tests.llamacpp_double import LlamaCppDouble, detokenize

    on = needs_harness("claude-code", "local")
    flow = script({"calls": [["Bash", {"command": "echo 42 > out.txt", "description": "Write 42 into out.txt"}]]},
                  {"answer": "out.txt holds 42."}, text="Write 42 into out.txt.")
    rows = [{"prompt": flow, "check": 'test "$(cat out.txt)" = 42'}]
    with LlamaCppDouble() as double:
        cli = CLI(tmp_path, None)
        res = cli.run("tok", write_jsonl(tmp_path / "d.jsonl", rows), model="double", base_url=double.base_url,
                      api_key="k", tokens="exact", require_reasoning=False, timeout=300, **on)
        sent = double.completions()
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("tok") / "trajectories.jsonl")
    assert record["verification"]["status"] == "pass"
    trace = TokenTrace.from_json(record["tokens"])
    assert len(trace.calls) == len(sent) == 2
    [row, *more] = trace.rows()
    assert "Claude Code" in detokenize(row["input_ids"][:row["loss_mask"].index(1)])
    masked = detokenize([i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
    assert masked == "".join(detokenize(c.completion) for c in trace.calls if c.segment == 0)
    assert "echo 42 > out.txt" in masked and masked.endswith("out.txt holds 42.<|im_end|>")
    assert not more, f"Claude Code's history came back otherwise than the model wrote it: {trace.segments} segments"
