"""Real agent harnesses, unmodified, in the prompt's sandbox (`--agent`): the Hermes Agent and
mini-swe-agent from PyPI (hermes-agent 0.19.0, mini-swe-agent 2.4.6, installed once into the user's
cache), their model calls answered through the runner's interception endpoint by the scripted model
server, on the local jail, Docker and Apptainer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.backend_harness import TEST_IMAGE, TEST_SIF, apptainer_status, docker_status, unavailable
from tests.conftest import CLI, ROOT, read_jsonl, tool_results_in, write_jsonl
from tests.scripted_model import ScriptedModel, script

SECRET = "sk-or-v1-HARNESSSECRET0123456789"


def needs_harness(agent: str, backend: str) -> dict:
    """The flags that run harness `agent` on `backend` (skips where it cannot be had)."""
    from hermes_batch.harness import HarnessSettings, harness_dir

    try:
        harness_dir(HarnessSettings(agent=agent), progress=False)
    except Exception as exc:  # noqa: BLE001 - the package index unreachable, say
        unavailable(agent, f"{agent} could not be installed: {exc}")
    if backend == "docker":
        if why := docker_status():
            unavailable("docker", why)
        return {"backend": "docker", "image": TEST_IMAGE, "agent": agent}
    if backend == "singularity":
        if why := apptainer_status():
            unavailable("singularity", why)
        return {"backend": "singularity", "image": TEST_SIF, "sandbox_root": "/tmp/hermes-batch-test-sandboxes",
                "agent": agent}
    return {"backend": backend, "agent": agent}


def needs_hermes(backend: str) -> dict:
    return needs_harness("hermes", backend)


def tool_turns(record: dict) -> list[tuple[str, str]]:
    return [(t["name"], t["content"]) for t in tool_results_in(record)]


@pytest.mark.parametrize("backend", ["local", "docker", "singularity"])
def test_the_hermes_agent_drives_a_prompt_in_its_sandbox_and_the_record_is_what_its_model_saw(backend, tmp_path):
    on = needs_hermes(backend)
    flow = script({"calls": [["terminal", {"command": "echo 42 > out.txt && cat out.txt"}]]},
                  {"calls": [["read_file", {"path": "out.txt"}]]},
                  {"answer": "It holds 42."}, text="Write 42 into out.txt, then read it back.")
    rows = [{"prompt": flow, "check": 'test "$(cat out.txt)" = 42'}]
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("hermes", write_jsonl(tmp_path / "d.jsonl", rows), toolsets="terminal,file",
                      require_reasoning=False, timeout=300, **on)
        sent = list(model.requests)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("hermes") / "trajectories.jsonl")
    assert record["verification"]["status"] == "pass"  # what the harness's terminal wrote is the sandbox's
    assert record["metadata"]["agent"] == "hermes==0.19.0" and record["metadata"]["harness"]["calls"] == 3
    # the model saw the Hermes Agent's own system prompt and tools, and the record keeps them
    system = sent[0]["messages"][0]
    assert system["role"] == "system" and "Hermes" in system["content"]
    assert record["conversations"][0]["content"] == system["content"]
    offered = {t["function"]["name"] for t in sent[0]["tools"]}
    assert {"terminal", "read_file", "write_file", "patch", "search_files"} <= offered
    assert set(record["metadata"]["tools_offered"]) == offered
    (first, said), (second, read) = tool_turns(record)
    assert first == "terminal" and json.loads(said) == {"output": "42", "exit_code": 0, "error": None}  # its own shape
    assert second == "read_file" and "42" in json.loads(read)["content"]
    assert record["conversations"][-1]["value"].endswith("It holds 42.")
    assert record["tool_stats"]["terminal"]["success"] == 1
    if backend != "local":
        return
    # the runner's own loop on the same row, beside it: `view` says what differs
    with ScriptedModel() as model:
        assert cli.run("native", tmp_path / "d.jsonl", toolsets="terminal,file", require_reasoning=False,
                       base_url=model.base_url).returncode == 0
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "view", "--run_name=native,hermes",
                          f"--output_dir={cli.out}", f"--output={tmp_path / 'cmp.html'}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "native: agent native; system prompt" in res.stderr and "hermes: agent hermes==0.19.0; system prompt" in res.stderr
    assert f"{len(offered)} tools offered; 3.0 model calls a trajectory" in res.stderr, res.stderr
    assert "tools only" not in res.stderr  # the same six tools, under the same names, each side


@pytest.mark.parametrize("backend", ["local", "docker", "singularity"])
def test_mini_swe_agent_drives_a_prompt_in_its_sandbox_and_the_record_is_what_its_model_saw(backend, tmp_path):
    on = needs_harness("mini-swe-agent", backend)
    flow = script({"calls": [["bash", {"command": "echo 42 > out.txt && pwd"}]]},
                  {"calls": [["bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]]},
                  text="Write 42 into out.txt, then submit.")
    rows = [{"prompt": flow, "cwd": "/srv/app", "check": 'test "$(cat out.txt)" = 42'}]
    workdir = "/workspace" if backend == "local" else "/srv/app"  # the jail keeps its own (a row's cwd is ignored)
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("mini", write_jsonl(tmp_path / "d.jsonl", rows), require_reasoning=False, timeout=300, **on)
        sent = list(model.requests)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("mini") / "trajectories.jsonl")
    assert record["verification"]["status"] == "pass"  # what its command wrote is the sandbox's, in the row's cwd
    assert record["metadata"]["agent"] == "mini-swe-agent==2.4.6" and record["api_calls"] == len(sent) == 2
    assert record["metadata"]["harness"]["ended"] == "Submitted"  # by its own rule, not a limit
    # its own system prompt and task template, and its one tool, as the model saw them
    system, task = sent[0]["messages"][:2]
    assert system == {"role": "system", "content": "You are a helpful assistant that can interact with a computer."}
    assert record["conversations"][0]["content"] == system["content"]
    assert task["content"].startswith("Please solve this issue: Write 42") and "COMPLETE_TASK_AND_SUBMIT" in task["content"]
    assert [t["function"]["name"] for t in sent[0]["tools"]] == record["metadata"]["tools_offered"] == ["bash"]
    (first, said), (second, submitted) = tool_turns(record)
    assert first == "bash" and json.loads(said) == {"returncode": 0, "output": f"{workdir}\n"}  # its own observation
    assert second == "bash" and json.loads(submitted)["returncode"] == 0  # the submission's result, never sent, kept
    assert record["tool_stats"]["bash"]["success"] == 2


def test_each_prompt_s_harness_reaches_its_own_endpoint_alone_and_never_the_run_s_key(tmp_path):
    """The run's key stays in the runner; a prompt's harness key opens only its own sandbox's
    endpoint, and only while its prompt runs; another sandbox's harness finds nothing there."""
    on = needs_hermes("local")
    look = ("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c HARNESS''SECRET; "  # (its own text no match)
            "grep -rl HARNESS''SECRET /tmp /workspace 2>/dev/null | wc -l; "
            "python3 -c \"import json,urllib.request as u\n"
            "key=json.load(open('/tmp/.hermes-batch-harness/spec.json'))['key']\n"
            "def ask(k):\n"
            "    r=u.Request('http://127.0.0.1:4000/v1/models',headers={'Authorization':'Bearer '+k})\n"
            "    try: return u.build_opener(u.ProxyHandler({})).open(r,timeout=5).status\n"
            "    except Exception as e: return getattr(e,'code',str(e))\n"
            "print(ask(key), ask('hb-not-this-prompts'))\"")
    flow = script({"calls": [["terminal", {"command": look}]]}, {"answer": "done"})
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("keys", write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}]), toolsets="terminal",
                      require_reasoning=False, api_key=SECRET, env={"OPENROUTER_API_KEY": SECRET}, timeout=300, **on)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("keys") / "trajectories.jsonl")
    [(_, said)] = tool_turns(record)
    lines = json.loads(said)["output"].split("\n")
    assert lines == ["0", "0", "200 401"], said  # no key of the run's anywhere; its own key alone is let in


def test_the_endpoint_refuses_another_prompt_s_key_and_a_prompt_that_ended(tmp_path):
    from hermes_batch.backends import SandboxSpec, load_backend
    from hermes_batch.harness import Intercept
    from tests.backend_harness import make_settings

    class Model:  # the run's model: answers anything
        async def complete(self, messages, tools, tool_choice=None, seed=None, trace=None, model=None):
            from hermes_batch.llm import Completion

            return Completion("fine", None, [], "stop", {"prompt_tokens": 1, "completion_tokens": 1})

    ask = ("python3 -c \"import sys,urllib.request as u\n"
           "r=u.Request('http://127.0.0.1:4000/v1/chat/completions',data=b'{\\\"messages\\\":[{\\\"role\\\":\\\"user\\\","
           "\\\"content\\\":\\\"hi\\\"}]}',headers={'Authorization':'Bearer '+sys.argv[1],'Content-Type':'application/json'})\n"
           "try: print(u.build_opener(u.ProxyHandler({})).open(r,timeout=5).status)\n"
           "except Exception as e: print(getattr(e,'code',type(e).__name__))\" ")

    async def main():
        backend = load_backend("local", make_settings(tmp_path))
        await backend.setup()
        one, two = [await backend.start(SandboxSpec(prompt_id=f"p{i}")) for i in range(2)]
        endpoint = Intercept(Model(), 5, "run-model")
        try:
            lines = [await endpoint.open(one), await endpoint.open(two)]
            own = await one.exec(ask + lines[0].key, timeout=30)
            others = await one.exec(ask + lines[1].key, timeout=30)  # another prompt's key, at this one's endpoint
            await lines[0].close()
            ended = await one.exec(ask + lines[0].key, timeout=30)
            await lines[1].close()
            return own.stdout.strip(), others.stdout.strip(), ended.stdout.strip(), len(lines[0].calls)
        finally:
            await one.close()
            await two.close()
            await backend.shutdown()

    own, others, ended, calls = asyncio.run(main())
    assert (own, others, calls) == ("200", "401", 1)
    assert ended in ("URLError", "ConnectionRefusedError", "401"), ended  # nothing answers for a prompt that ended


def test_a_harness_that_cannot_reach_its_model_fails_its_prompt_saying_why(tmp_path):
    on = needs_hermes("local")
    rows = [{"prompt": script({"fault": {"status": 400, "error": {"message": "the model refuses this"}}})}]
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("dead", write_jsonl(tmp_path / "d.jsonl", rows), toolsets="terminal", require_reasoning=False,
                      max_retries=0, timeout=300, **on)
    assert res.returncode == 3, res.stderr[-3000:]
    [failure] = read_jsonl(cli.run_dir("dead") / "failed.jsonl")
    assert failure["error_kind"] == "harness_failed" and "the model refuses this" in failure["error"], failure


@pytest.mark.parametrize("backend", ["local", "singularity"])  # (on Apptainer it lived on, its calls answered)
def test_no_harness_process_outlives_a_runner_killed_mid_prompt(backend, tmp_path):
    on = needs_hermes(backend)
    tag = f"hb-harness-{tmp_path.name}"
    flow = script({"calls": [["terminal", {"command": f"sleep 600 # {tag}"}]]}, {"answer": "never"})
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        proc = cli.popen("killed", write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}]), toolsets="terminal",
                         require_reasoning=False, **on)
        try:
            deadline = time.monotonic() + 120
            while not _with(tag) or not _with("drive.py"):
                assert time.monotonic() < deadline and proc.poll() is None, "the harness never ran its command"
                time.sleep(0.2)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    deadline = time.monotonic() + 30
    while _with(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _with(tag), "the harness's command outlived the runner"


def test_a_harness_that_crashes_mid_task_fails_its_prompt_with_its_last_words(tmp_path):
    on = needs_hermes("local")
    # the command ends the harness's own process (its terminal tool's parent): it dies mid-task
    flow = script({"calls": [["terminal", {"command": "echo going down >&2; kill -9 $PPID"}]]}, {"answer": "never"})
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("crash", write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}]), toolsets="terminal",
                      require_reasoning=False, timeout=300, **on)
    assert res.returncode == 3, res.stderr[-3000:]
    assert not (cli.run_dir("crash") / "trajectories.jsonl").exists() or not read_jsonl(
        cli.run_dir("crash") / "trajectories.jsonl")
    [failure] = read_jsonl(cli.run_dir("crash") / "failed.jsonl")
    assert failure["error_kind"] == "harness_failed", failure
    assert "after 1 model calls: it asked for tools and died" in failure["error"], failure


def test_a_harness_that_hangs_is_ended_at_the_prompt_timeout_and_what_it_did_is_kept(tmp_path):
    on = needs_hermes("local")
    tag = f"hb-hang-{tmp_path.name}"
    flow = script({"calls": [["terminal", {"command": f"echo started; sleep 600 # {tag}"}]]}, {"answer": "never"})
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        began = time.monotonic()
        res = cli.run("hang", write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}]), toolsets="terminal",
                      require_reasoning=False, prompt_timeout=25, timeout=300, **on)
        took = time.monotonic() - began
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("hang") / "trajectories.jsonl")
    assert record["metadata"]["stop_reason"] == "prompt_timeout", record["metadata"]
    assert record["metadata"]["harness"]["calls"] == 1  # the call it made before it hung, kept
    assert not _with(tag), "the hung harness's command outlived its prompt"
    assert took < 25 + 60, f"the prompt ran {took:.0f} s past a 25 s timeout"


def test_a_harness_run_killed_mid_prompt_resumes_to_each_row_once(tmp_path):
    on = needs_hermes("local")
    tag = f"hb-resume-{tmp_path.name}"
    quick = script({"calls": [["terminal", {"command": "echo quick"}]]}, {"answer": "done quick"}, text="Quick.")
    slow = script({"calls": [["terminal", {"command": f"sleep 8 # {tag}"}]]}, {"answer": "done slow"}, text="Slow.")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": quick}, {"prompt": slow}])
    flags = dict(toolsets="terminal", require_reasoning=False, **on)
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        run = cli.run_dir("crash")
        proc = cli.popen("crash", data, **flags)
        try:
            deadline = time.monotonic() + 180
            while not (_with(tag) and written(run)):
                assert time.monotonic() < deadline and proc.poll() is None, "the two prompts never got going"
                time.sleep(0.2)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        [kept] = written(run)
        res = cli.run("crash", data, resume=True, timeout=300, **flags)
        assert res.returncode == 0, res.stderr[-3000:]
        records = read_jsonl(run / "trajectories.jsonl")
        quick_calls = sum("Quick." in json.dumps(r["messages"]) for r in model.requests)
    assert sorted(r["conversations"][-1]["value"].rsplit("\n", 1)[-1] for r in records) == ["done quick", "done slow"]
    assert kept in records  # the finished prompt's record, as it was, not run again
    assert quick_calls == 2, f"the finished prompt's model calls were made again ({quick_calls})"


def written(run) -> list[dict]:
    """The records a run has written to its shards so far (a torn last line not yet one)."""
    found = []
    for shard in run.glob("batch_*.jsonl"):
        for line in shard.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def _with(word: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("flag, value", [("toolsets", "terminal,file"), ("distribution", "default")])
def test_a_harness_with_its_own_tools_refuses_toolsets_and_distributions_naming_the_flag(flag, value, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    cli = CLI(tmp_path, None)
    res = cli.run("own", data, agent="mini-swe-agent", base_url="http://127.0.0.1:9/v1", timeout=60, **{flag: value})
    assert res.returncode != 0 and not cli.run_dir("own").exists()
    assert f"--{flag} does not apply to --agent=mini-swe-agent: it brings its own tools (bash)" in res.stderr, res.stderr
    from hermes_batch.config import ConfigError, configure

    for agent in ("claude-code", "codex"):  # they bring theirs too
        with pytest.raises(ConfigError, match=f"--{flag} does not apply to --agent={agent}: it brings its own tools"):
            configure({"dataset_file": str(data), "run_name": "r", "output_dir": str(tmp_path), "agent": agent,
                       flag: value})
    given = {"dataset_file": str(data), "run_name": "r", "output_dir": str(tmp_path), flag: value}
    assert configure({**given, "agent": "hermes"}).harness_release == "hermes==0.19.0"  # it is given the toolsets


def test_a_backend_that_cannot_hand_its_sandboxes_the_harness_is_refused_before_anything_starts(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={data}", "--run_name=m",
                          "--backend=modal", "--agent=hermes", "--model=m", "--base_url=http://127.0.0.1:9/v1",
                          f"--output_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "--agent=hermes runs on the local, docker and singularity backends" in res.stderr and "the modal backend" in res.stderr
    assert not (tmp_path / "m").exists()


def test_a_trainer_s_rollouts_run_the_real_harness_token_exact_as_steps_and_on_the_service(tmp_path):
    """Rollouts for training through a real agent: the Hermes Agent drives each rollout (a step's
    group, and a request to the rollout service), and a trainer gets one token sequence per rollout
    whose prompt holds Hermes's own system prompt and whose unmasked ids are the model's replies."""
    from hermes_batch.rollout import RolloutRequest, Rollouts, RolloutService, wait_for
    from tests.llamacpp_double import LlamaCppDouble, detokenize

    on = needs_hermes("local")
    flow = script({"calls": [["terminal", {"command": "echo 42 > out.txt"}]]}, {"answer": "It holds 42."},
                  text="Write 42 into out.txt.")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow, "check": 'test "$(cat out.txt)" = 42'}])
    with LlamaCppDouble() as double:
        flags = {"model": "double", "base_url": double.base_url, "api_key": "k", "toolsets": "terminal",
                 "sandbox_root": str(tmp_path / "sandboxes"), **on}
        step = Rollouts(data, run_name="rl", output_dir=tmp_path / "out", **flags).run([flow, flow], 3)
        with RolloutService(data, run_name="served", output_dir=tmp_path / "data", **flags) as service:
            service.submit(RolloutRequest(rollout_id="r1", task=flow, policy_version=3))
            served = wait_for(service, "r1", timeout=300)
    assert [(r.reward, r.error) for r in step.rollouts] == [(1.0, None), (1.0, None)], step.rollouts
    for rollout in step.rollouts:
        assert "Hermes" in detokenize(rollout.prompt_ids) and rollout.policy_version == 3
        mine = detokenize([i for i, m in zip(rollout.completion_ids, rollout.env_mask, strict=True) if m])
        assert "echo 42 > out.txt" in mine and mine.endswith("It holds 42.<|im_end|>") and "Hermes" not in mine
    assert served.state == "done" and served.reward == 1.0 and served.error is None and len(served.turns) == 2
    assert detokenize(served.turns[-1].completion_ids).startswith("It holds 42.")


def test_rollouts_refuse_an_agent_home_named_by_a_directory_which_a_step_s_rows_cannot_carry(tmp_path):
    from hermes_batch.config import ConfigError
    from hermes_batch.rollout import Rollouts

    (tmp_path / "home" / "memories").mkdir(parents=True)
    (tmp_path / "home" / "memories" / "MEMORY.md").write_text("slot 7")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi", "agent_home": "home"}])
    with pytest.raises(ConfigError, match="d.jsonl:1: 'agent_home' names a directory"):
        Rollouts(data, run_name="r", output_dir=tmp_path, base_url="http://127.0.0.1:9/v1", model="m", agent="hermes")


def exact_through_the_endpoint(tmp_path, agent: str, flow: str, **flags) -> tuple[dict, Any, list, str, str]:
    """Harness `agent` on `flow` (its check wants 42 in out.txt) against a token-giving server with
    --tokens=exact, and what holds for every harness: the check passes, each of the server's two
    calls is traced as it was sent, the trace is one segment (the history the harness sends back
    renders as its model wrote it), and its masked ids are the server's completions exactly.
    Returns (record, trace, what the server was sent, the ids before the mask and the masked ids as text)."""
    from hermes_batch.tokens.trace import TokenTrace
    from tests.llamacpp_double import LlamaCppDouble, detokenize

    on = needs_harness(agent, "local")
    rows = [{"prompt": flow, "check": 'test "$(cat out.txt)" = 42'}]
    with LlamaCppDouble() as double:
        cli = CLI(tmp_path, None)
        res = cli.run("tok", write_jsonl(tmp_path / "d.jsonl", rows), model="double", base_url=double.base_url,
                      api_key="k", tokens="exact", require_reasoning=False, timeout=300, **on, **flags)
        sent = double.completions()
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("tok") / "trajectories.jsonl")
    assert record["verification"]["status"] == "pass"
    trace = TokenTrace.from_json(record["tokens"])
    assert len(trace.calls) == len(sent) == 2
    for i, body in enumerate(sent):
        assert trace.prompt_of(i) == body["prompt"]  # what the server was sent, id for id
    [row, *more] = trace.rows()
    assert not more, f"{agent}'s history came back otherwise than the model wrote it: {trace.segments} segments"
    masked = detokenize([i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
    assert masked == "".join(detokenize(c.completion) for c in trace.calls)
    return record, trace, sent, detokenize(row["input_ids"][:row["loss_mask"].index(1)]), masked


def test_a_harness_s_rollout_is_token_exact_and_only_the_model_s_own_ids_are_under_the_loss_mask(tmp_path):
    """--tokens=exact through the endpoint: the Hermes Agent's calls are rendered and tokenised by
    the runner, every kept id and log-probability is the server's, and the ids under the mask are
    exactly what the server returned (a history the harness rewrote would start a segment)."""
    from tests.llamacpp_double import logprob

    flow = script({"calls": [["terminal", {"command": "echo 42 > out.txt"}]]}, {"answer": "It holds 42."},
                  text="Write 42 into out.txt.")
    record, trace, _, before, masked = exact_through_the_endpoint(tmp_path, "hermes", flow, toolsets="terminal")
    assert record["metadata"]["agent"] == "hermes==0.19.0" and record["tokens"]["plain_text"]
    for call in trace.calls:
        assert [round(lp, 4) for lp in call.logprobs] == [round(logprob(i), 4) for i in range(len(call.completion))]
    # Hermes's own system prompt is in the ids, never under the mask; the masked ids are its replies
    assert "Hermes" in before
    assert "echo 42 > out.txt" in masked and masked.endswith("It holds 42.<|im_end|>")


def test_a_side_call_made_during_a_turn_is_never_rendered_into_the_turn_s_token_ids():
    """From a review: a harness's side call (a title, a summary) that finished while a main turn was
    in flight changed the trace the next turns were rendered against: the model was sent the side
    conversation followed by the main one, and the record kept ids nobody had sent. Each call's
    recorded prompt is now what was sent for it, and no main turn holds the side call's text."""
    from hermes_batch.harness.intercept import Line
    from hermes_batch.harness.wire import Ask
    from hermes_batch.llm import ModelSettings, open_client
    from hermes_batch.tokens import TokenTrace
    from hermes_batch.util.limits import AdaptiveLimit
    from tests.llamacpp_double import LlamaCppDouble, detokenize

    main = "SCRIPT: " + json.dumps([{"calls": [["terminal", {"command": c}]]} for c in ("ls", "pwd", "id")]
                                    + [{"answer": "done"}])
    tools = [{"type": "function", "function": {"name": "terminal", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]

    class Double(LlamaCppDouble):  # the side call quick, a main turn slow: it ends while a turn is in flight
        async def _completion(self, request):
            self.latency = 0.05 if "A title" in detokenize((await request.json())["prompt"]) else 0.5
            return await super()._completion(request)

    def then(history, reply, output):
        call = reply.tool_calls[0]
        return [*history, {"role": "assistant", "content": reply.content, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": output}]

    async def harness(double):
        llm = open_client(ModelSettings(model="double", base_url=double.base_url, tokens="exact"), "k", AdaptiveLimit(8))
        line = Line("key", llm, 10, TokenTrace())
        history = [{"role": "system", "content": "sys"}, {"role": "user", "content": main}]
        first = await line.answer(Ask(history, tools))
        history = then(history, first.reply, "a b")
        aside = [{"role": "system", "content": "title"}, {"role": "user", "content": "SCRIPT: " + json.dumps(
            [{"answer": "A title"}])}]

        async def side():
            await asyncio.sleep(0.05)
            return await line.answer(Ask(aside, []))

        turn, _ = await asyncio.gather(line.answer(Ask(history, tools)), side())
        history = then(history, turn.reply, "/w")
        turn = await line.answer(Ask(history, tools))
        await line.answer(Ask(then(history, turn.reply, "uid"), tools))
        await llm.close()
        return line.trace

    with Double() as double:
        trace = asyncio.run(harness(double))
        sent = [body["prompt"] for body in double.completions()]
    assert len(trace.calls) == len(sent) == 5
    for i, call in enumerate(trace.calls):  # each call as sent, in the order sent
        assert trace.prompt_of(i) == sent[i] and double.reply(sent[i]) == call.completion
    for prompt in sent:
        text = detokenize(prompt)
        assert ("A title" in text) == text.startswith("<|im_start|>system\ntitle"), text[:200]
    assert sum("A title" in detokenize(p) for p in sent) == 1


def test_the_rollout_service_hands_a_trainer_the_task_s_turns_and_not_a_harness_s_asides():
    """From a review: the service answered every traced call as a turn of the task, a harness's aside
    (a title, a summary, the history before a compaction) included, each with the task's reward."""
    from hermes_batch.rollout.service.rollouts import _from_record
    from hermes_batch.rollout.service.wire import RolloutRequest
    from hermes_batch.tokens import TokenTrace
    from hermes_batch.tokens.trace import TokenCall

    trace = TokenTrace(calls=[TokenCall(0, [1, 2], [10], [-0.5]), TokenCall(1, [7, 8], [11], [-0.5]),
                              TokenCall(2, [1, 2, 10, 3], [12], [-0.5])], plain_text=True)
    record = {"id": "p", "verification": {"status": "pass", "score": 1.0}, "tokens": trace.to_json(),
              "conversations": [], "metadata": {"harness": {"side_threads": [{"thread": 1, "follows": 0,
                                                                              "calls": [1], "token_calls": [1]}]}}}
    result = _from_record(RolloutRequest(rollout_id="r", task="t"), record)
    assert result.reward == 1.0 and [t.completion_ids for t in result.turns] == [[10], [12]]
    assert [t.prompt_ids for t in result.turns] == [[1, 2], [1, 2, 10, 3]]


def test_mini_swe_agent_s_rollout_is_token_exact_through_the_endpoint(tmp_path):
    """--tokens=exact with mini-swe-agent: its litellm calls, rendered and tokenised by the runner;
    the history it sends back (its tool call, its JSON observation) renders as the model wrote it,
    so the record is one segment and the ids under the mask are the server's own."""
    flow = script({"calls": [["bash", {"command": "echo 42 > out.txt"}]]},
                  {"calls": [["bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]]},
                  text="Write 42 into out.txt, then submit.")
    record, _, _, before, masked = exact_through_the_endpoint(tmp_path, "mini-swe-agent", flow)
    assert record["metadata"]["harness"]["ended"] == "Submitted"
    assert "You are a helpful assistant that can interact with a computer." in before
    assert "echo 42 > out.txt" in masked and "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in masked


def test_a_side_thread_of_calls_is_kept_whole_beside_the_conversation_and_linked_to_the_one_before_it():
    """A harness that asks its model something aside (a summary, a subagent) mid-task: the record's
    conversation is the main thread, and the aside is kept whole, not merely counted."""
    from hermes_batch.harness.intercept import Call
    from hermes_batch.harness.transcript import fill, split
    from hermes_batch.llm import Completion
    from hermes_batch.record import AgentRun
    from hermes_batch.record.build import side_threads

    def reply(text, calls=()):
        return Completion(text, None, list(calls), "tool_calls" if calls else "stop", {"prompt_tokens": 3})

    system = {"role": "system", "content": "You are the main agent."}
    ask = {"role": "user", "content": "Count the files."}
    step = [{"id": "c1", "name": "terminal", "arguments": '{"command": "ls | wc -l"}'}]
    sent = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "terminal", "arguments": '{"command": "ls | wc -l"}'}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": '{"output": "3", "exit_code": 0, "error": null}'}
    aside = [{"role": "system", "content": "Summarise what the agent did."}, {"role": "user", "content": "ran ls"}]
    calls = [Call([system, ask], [], {}, reply("", step), traced=0),
             Call(aside, [], {}, reply("It listed files."), traced=1),
             Call([system, ask, sent, result], [], {}, reply("There are 3 files."), traced=2)]
    assert [(t.calls, t.follows) for t in split(calls)] == [([0, 2], None), ([1], 0)]

    run = AgentRun()
    said, _ = fill(run, calls)
    assert said == "You are the main agent." and run.final_answer == "There are 3 files."
    [kept] = side_threads(run)
    assert kept["thread"] == 1 and kept["follows"] == 0 and kept["calls"] == [1] and kept["token_calls"] == [1]
    assert kept["conversations"][0]["content"] == "Summarise what the agent did."  # its own system prompt
    assert [(t["from"], t["value"]) for t in kept["conversations"][1:]] == [("human", "ran ls"),
                                                                           ("gpt", "<think>\n</think>\nIt listed files.")]


def test_a_row_s_agent_home_seeds_the_hermes_agent_s_state_for_that_prompt_alone(tmp_path):
    on = needs_hermes("local")
    seeded = {"prompt": script({"answer": "ok"}, text="Seeded."),
              "agent_home": {"config.yaml": "memory:\n  memory_enabled: true\n",
                             "memories/MEMORY.md": "The deploy notes live in vault slot 7."}}
    fresh = {"prompt": script({"answer": "ok"}, text="Fresh.")}
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("home", write_jsonl(tmp_path / "d.jsonl", [seeded, fresh]), toolsets="terminal",
                      require_reasoning=False, timeout=300, **on)
    assert res.returncode == 0, res.stderr[-3000:]
    system = {r["conversations"][1]["value"]: r["conversations"][0]["content"]
              for r in read_jsonl(cli.run_dir("home") / "trajectories.jsonl")}
    [(seeded_prompt, seeded_system)] = [(p, s) for p, s in system.items() if "Seeded." in p]
    assert "vault slot 7" in seeded_system  # its memory, as the Hermes Agent reads it into its prompt
    assert not any("vault slot 7" in s for p, s in system.items() if "Fresh." in p)  # the other starts empty


def test_the_embedded_model_drives_the_real_hermes_agent_on_a_checked_prompt_token_exact(tmp_path):
    """The real parts end to end: the embedded model's llama.cpp server, the Hermes Agent from PyPI
    in the jail, --tokens=exact through the endpoint. Every kept id and log-probability is the
    server's, and the ids under the loss mask decode to the model's own replies. (One prompt: the
    Hermes Agent's instructions and tools are about 4,800 tokens, read at about 20 a second here.)"""
    import math
    import urllib.request

    from hermes_batch.llm.local_model import LocalModelServer, resolve_model_file
    from hermes_batch.tokens.trace import TokenTrace
    from tests.llamacpp_relay import recording_relay
    from tests.test_local_model import _real_model_status

    if why := _real_model_status():
        unavailable("local-model", why)
    on = needs_hermes("local")

    def detokenize(url: str, ids: list[int]) -> str:
        req = urllib.request.Request(f"{url}/detokenize", json.dumps({"tokens": ids}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.load(resp)["content"]

    row = {"prompt": "Use the terminal tool to run `echo $((6*7))`, then answer with the number it printed.",
           "expected": 42}
    with LocalModelServer(resolve_model_file(None), threads=2, ctx=8192, parallel=1,
                          log_path=tmp_path / "server.log") as server:
        target = server.url.removesuffix("/v1")
        with recording_relay(target) as (url, seen):
            cli = CLI(tmp_path, None)
            res = cli.run("real", write_jsonl(tmp_path / "d.jsonl", [row]), model="mine", base_url=url, api_key="x",
                          tokens="exact", toolsets="terminal", temperature=0, max_turns=3, max_tokens=96,
                          require_reasoning=False, timeout=1800, **on)
        assert res.returncode == 0, res.stderr[-3000:]
        [record] = read_jsonl(cli.run_dir("real") / "trajectories.jsonl")
        assert record["metadata"]["agent"] == "hermes==0.19.0"
        assert record["verification"]["status"] in ("pass", "fail"), record["verification"]  # judged, not an error
        trace = TokenTrace.from_json(record["tokens"])
        assert len(trace.calls) == len(seen) >= 1
        for call, (sent, answer) in zip(trace.calls, seen, strict=True):
            assert trace.prompt_of(trace.calls.index(call)) == sent["prompt"]  # what the server was sent, id for id
            assert call.completion == answer["tokens"]  # what it returned, as it was
            returned = [p["logprob"] if "logprob" in p else math.log(p["prob"]) for p in answer["completion_probabilities"]]
            assert all(abs(a - b) <= 1e-4 for a, b in zip([lp for lp in call.logprobs if lp == lp], returned, strict=True))
        for r in trace.rows():
            assert "Hermes" not in detokenize(target, [i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
        first = trace.rows()[0]
        masked = detokenize(target, [i for i, m in zip(first["input_ids"], first["loss_mask"], strict=True) if m])
        assert masked == "".join(detokenize(target, c.completion) for c in trace.calls if c.segment == 0)
