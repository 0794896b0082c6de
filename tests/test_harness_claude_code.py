"""Claude Code, unmodified (`@anthropic-ai/claude-code` from the npm registry, its Linux executable
installed once into the user's cache), driving a prompt in print mode in the local jail, on Docker
and on Apptainer: its model calls reach the runner's interception endpoint as Anthropic's Messages
API and are answered by the scripted model server; the record is what its model saw."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CLI, read_jsonl, tool_results_in, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_harness import exact_through_the_endpoint, needs_harness


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
    flow = script({"calls": [["Bash", {"command": "echo 42 > out.txt", "description": "Write 42 into out.txt"}]]},
                  {"answer": "out.txt holds 42."}, text="Write 42 into out.txt.")
    _, _, _, before, masked = exact_through_the_endpoint(tmp_path, "claude-code", flow)
    assert "Claude Code" in before
    assert "echo 42 > out.txt" in masked and masked.endswith("out.txt holds 42.<|im_end|>")

