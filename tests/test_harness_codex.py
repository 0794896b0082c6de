"""Codex, unmodified (`@openai/codex` from the npm registry, its Linux executable installed once
into the user's cache), driving a prompt as `codex exec` in the local jail and on Docker: its model
calls reach the runner's interception endpoint as OpenAI's Responses API and are answered by the
scripted model server; the record is what its model saw."""

from __future__ import annotations

import json

import pytest

from tests.backend_harness import TEST_IMAGE, docker_status, unavailable
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script


def needs_codex(backend: str) -> dict:
    from hermes_batch.harness import HarnessSettings, harness_dir

    try:
        harness_dir(HarnessSettings(agent="codex"), progress=False)
    except Exception as exc:  # noqa: BLE001 - the npm registry unreachable, say
        unavailable("codex", f"@openai/codex could not be installed: {exc}")
    if backend == "docker":
        if why := docker_status():
            unavailable("docker", why)
        return {"backend": "docker", "image": TEST_IMAGE, "agent": "codex"}
    return {"backend": backend, "agent": "codex"}


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_codex_drives_a_prompt_in_its_sandbox_and_the_record_holds_its_own_instructions(backend, tmp_path):
    on = needs_codex(backend)
    flow = script({"calls": [["exec_command", {"cmd": "echo 42 > out.txt"}]]}, {"answer": "out.txt holds 42."},
                  text="Write 42 into out.txt.")
    rows = [{"prompt": flow, "check": 'test "$(cat out.txt)" = 42'}]
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("codex", write_jsonl(tmp_path / "d.jsonl", rows), require_reasoning=False, timeout=300, **on)
        sent = list(model.requests)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("codex") / "trajectories.jsonl")
    assert record["verification"]["status"] == "pass"  # what its shell tool wrote is the sandbox's
    assert record["metadata"]["agent"] == "codex==0.171.0"
    assert record["metadata"]["harness"]["calls"] == len(sent) == 2, [m["messages"][-1] for m in sent]
    instructions = sent[0]["messages"][0]
    assert instructions["role"] == "system" and "Codex CLI" in instructions["content"]  # its own, as it sent them
    assert record["conversations"][0]["content"].startswith(instructions["content"])
    offered = {t["function"]["name"] for t in sent[0]["tools"]}
    assert "exec_command" in offered and set(record["metadata"]["tools_offered"]) == offered
    [tool] = [t for t in record["conversations"] if t["from"] == "tool"]
    assert tool["name"] == "exec_command" and "exited with code 0" in tool["value"]
    assert record["conversations"][-1]["value"].endswith("out.txt holds 42.")
    assert json.dumps(record).count("hb-") == 0  # the prompt's key is not in its record
