"""hermes-batch as TRL's rollout engine (hermes_batch/rollout): GRPO on the CPU with a tiny random
Qwen2 policy (tests/tiny_policy.py), llama.cpp serving a GGUF of the trainer's own weights written
after every step, the real agent loop in the real local jail, real checks in the sandbox."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.backend_harness import unavailable
from tests.conftest import read_jsonl, write_jsonl

COIN = "test $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0"  # a check whose verdict varies within a group
ROWS = [
    {"prompt": "Flip a coin.", "check": COIN},
    {"prompt": "Flip another coin.", "check": COIN},
    # an absolute check file needs a sandbox with a root of its own: on the local jail the check errs
    {"prompt": "Say anything.", "check": "true", "check_files": {"/etc/hermes-batch-test": "x"}},
]
GENERATIONS = 4


def needs_rl() -> None:
    missing = []
    for module in ("trl", "torch", "gguf", "xllamacpp"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        unavailable("rl", f"{', '.join(missing)} not installed (pip install -e '.[rl,local]')")


def train(tmp_path, *, sync: bool, steps: int):
    """A GRPO run of `steps` steps; what TRL was given, the server-vs-trainer gap per step, the rewards TRL saw."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from hermes_batch.rollout.trl import TRLRollouts
    from tests import tiny_policy

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tmp_path.mkdir(parents=True, exist_ok=True)
    dataset = write_jsonl(tmp_path / "rl.jsonl", ROWS)
    env = TRLRollouts(dataset, run_name="grpo", output_dir=tmp_path / "data", sync=sync,
                      vocabulary=tiny_policy.vocabulary_gguf(tmp_path / "vocab.gguf"),
                      model="local", toolsets=["terminal"], max_turns=1, max_tokens=24, num_workers=1,
                      concurrency=12, local_parallel=4, local_ctx=8192, sandbox_root=str(tmp_path / "sandboxes"))
    model = tiny_policy.policy()
    initial = copy.deepcopy(model.state_dict())
    given, gaps, rewards = [], [], []

    def rollout(prompts, trainer):
        out = env.rollout_func(prompts, trainer)
        given.append((trainer.state.global_step, {k: list(v) for k, v in out.items()}))
        gaps.append(_gap(trainer.model, env.steps[-1], torch))
        return out

    def reward(prompts, completions, hermes_reward, rollout_id, **kw):
        rewards.append(dict(zip(rollout_id, hermes_reward, strict=True)))
        return env.reward(prompts, completions, hermes_reward)

    # lr 0.01: Adam's first steps move every weight by about that much. llama.cpp's CPU kernels and torch
    # drift apart as a random model sharpens (mean |Δ| up to 0.01 after one step at 0.05, 0.002 at 0.01),
    # while the unsynced control stays 100× off
    args = GRPOConfig(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=len(ROWS) * GENERATIONS,
                      num_generations=GENERATIONS, max_steps=steps, learning_rate=0.01, use_cpu=True, report_to=[],
                      logging_steps=1, temperature=1.0, beta=0.0, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, processing_class=tiny_policy.tokenizer(), args=args,
                          train_dataset=env.dataset(), reward_funcs=reward, rollout_func=rollout,
                          callbacks=[env.weight_sync()])
    trainer.train()
    return env, trainer, initial, given, gaps, rewards


def _gap(model, step, torch) -> float:
    """Mean |server log-probability − the trainer's own| over the model's tokens of a step's rollouts."""
    diffs = []
    with torch.no_grad():
        for r in step.rollouts:
            if not r.usable:
                continue
            logits = model(torch.tensor([r.prompt_ids + r.completion_ids])).logits[0].float()
            own = torch.log_softmax(logits, -1)
            for i, (tok, mask, lp) in enumerate(zip(r.completion_ids, r.env_mask, r.logprobs, strict=True)):
                if mask and not math.isnan(lp):
                    diffs.append(abs(lp - own[len(r.prompt_ids) + i - 1, tok].item()))
    assert diffs, "no token of the step had a log-probability to compare"
    return sum(diffs) / len(diffs)


@pytest.mark.embedded_model  # llama.cpp takes both cores while it decodes
def test_grpo_trains_on_checked_rollouts_sampled_from_its_own_weights(tmp_path):
    needs_rl()
    import torch

    from hermes_batch.tokens import TokenTrace

    env, trainer, initial, given, gaps, rewards = train(tmp_path / "synced", sync=True, steps=3)
    run_dir = tmp_path / "synced" / "data" / "grpo"
    assert [step for step, _ in given] == [0, 1, 2]
    for (step, out), seen in zip(given, rewards, strict=True):
        records = {r["id"]: r for r in read_jsonl(run_dir / "steps" / f"{step:06d}-train-0" / "trajectories.jsonl")}
        assert len(out["prompt_ids"]) == len(ROWS) * GENERATIONS == len(records)
        assert set(out["policy_version"]) == {step}  # the weights of the step it was generated at
        for i, rid in enumerate(out["rollout_id"]):
            record = records[rid.split("/", 1)[1]]
            assert record["metadata"]["dataset"]["policy_version"] == step
            assert record["metadata"]["model"] == f"local:policy-v{step:06d}"
            trace = TokenTrace.read(record["tokens"])
            [segment] = trace.rows()  # one sequence: no prefix drift
            # TRL got the ids the server returned, unchanged
            assert out["prompt_ids"][i] + out["completion_ids"][i] == segment["input_ids"]
            assert out["env_mask"][i] == segment["loss_mask"][len(out["prompt_ids"][i]):]
            verdict = record["verification"]
            expected = verdict["score"] if verdict["status"] in ("pass", "fail") else None
            assert seen[rid] == out["hermes_reward"][i] == expected  # the reward TRL saw is the check's score
            if record["prompt_id"] == _prompt_id(records, "Say anything."):
                assert verdict["status"] == "error" and seen[rid] is None  # an errored check reaches TRL as None
    assert all(g <= 5e-3 for g in gaps), gaps  # server and trainer agree: the server serves the trainer's weights

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    grads = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(losses) == 3 and all(math.isfinite(float(x)) for x in losses)
    assert any(float(g) > 0 for g in grads), grads  # some group had rewards that differ
    moved = max((trainer.model.state_dict()[k] - v).abs().max().item() for k, v in initial.items())
    assert moved > 1e-3
    # every sandbox gone: no jail directory, no process of the run
    left = [p for run in (tmp_path / "synced" / "sandboxes").iterdir() for p in run.iterdir()
            if not p.name.startswith(".")]  # a run's directory stays; a prompt's sandbox is a directory in it
    assert not left, left
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps

    # the control: without the sync the server samples the first weights, and drifts from the trainer's
    _, _, _, _, control, _ = train(tmp_path / "unsynced", sync=False, steps=2)
    assert control[-1] >= 10 * max(gaps), (control, gaps)
    del torch


@pytest.mark.embedded_model
def test_grpo_asks_its_rollouts_of_a_rollout_service_and_a_restarted_trainer_gets_them_back(tmp_path):
    """TRL's rollout_func on the rollout service over HTTP (a service started once, its sandboxes and
    model server warm across steps): each step's weights written as GGUF into the service's policy
    directory, and its embedded llama.cpp swapping to them before the step's rollouts."""
    needs_rl()
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from hermes_batch.rollout import RolloutRequest, RolloutService, ServiceServer, wait_for, write_gguf
    from hermes_batch.rollout.trl import TRLRollouts, fingerprint
    from hermes_batch.tokens import TokenTrace
    from tests import tiny_policy

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    model = tiny_policy.policy()
    initial = copy.deepcopy(model.state_dict())
    vocabulary = tiny_policy.vocabulary_gguf(tmp_path / "vocab.gguf")
    weights = write_gguf(tiny_policy.policy(seed=1), tmp_path / "other.gguf", vocabulary)  # not the policy's
    given, asked, gaps, seen = [], [], [], {}
    with RolloutService(write_jsonl(tmp_path / "rl.jsonl", ROWS), run_name="served", output_dir=tmp_path / "data",
                        model="local", local_model=str(weights), toolsets=["terminal"], max_turns=1, max_tokens=24,
                        num_workers=1, concurrency=12, local_parallel=4, local_ctx=8192,
                        sandbox_root=str(tmp_path / "sandboxes")) as service:
        server = ServiceServer(service).start()
        try:
            env = TRLRollouts.on_service(server.url, token=server.token, vocabulary=vocabulary, timeout=600)

            def rollout(prompts, trainer):
                out = env.rollout_func(prompts, trainer)
                given.append((trainer.state.global_step, {k: list(v) for k, v in out.items()}))
                asked.append(list(prompts))
                gaps.append(_gap(trainer.model, env.steps[-1], torch))
                return out

            def reward(prompts, completions, hermes_reward, rollout_id, **kw):
                seen.update(zip(rollout_id, hermes_reward, strict=True))
                return env.reward(prompts, completions, hermes_reward)

            args = GRPOConfig(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=len(ROWS) * GENERATIONS,
                              num_generations=GENERATIONS, max_steps=2, learning_rate=0.01, use_cpu=True, report_to=[],
                              logging_steps=1, temperature=1.0, beta=0.0, save_strategy="no", seed=0)
            trainer = GRPOTrainer(model=model, processing_class=tiny_policy.tokenizer(), args=args,
                                  train_dataset=env.dataset(), reward_funcs=reward, rollout_func=rollout)
            assert sorted(env.dataset()["prompt"]) == sorted(r["prompt"] for r in ROWS)  # the service's dataset
            trainer.train()
            # weights it cannot serve: the rollouts asked for them fail saying so, and the last ones serve on
            (service.policy_dir / "broken.gguf").write_bytes(b"not a GGUF file")
            for rid, weights_file in (("broken", "broken.gguf"), ("after", "policy-v000001.gguf")):
                service.submit(RolloutRequest(rollout_id=rid, task=ROWS[0]["prompt"], weights=weights_file))
            broken, after = wait_for(service, "broken", 300), wait_for(service, "after", 300)
            assert broken.state == "failed" and "cannot serve broken.gguf" in broken.error, broken
            assert after.state == "done" and after.model == "local:policy-v000001", after
            settled = service.info().settled

            # a trainer restarted from its first checkpoint asks step 0 again (in-process this time): the
            # same rollouts, none run again
            again = TRLRollouts.on_service(service, vocabulary=vocabulary)
            first = given[0][1]
            redo = again.engine.run(asked[0], 0, policy=fingerprint_of(initial, tiny_policy, fingerprint))
            assert [f"served/{r.rollout_id}" for r in redo.rollouts] == first["rollout_id"]
            assert [r.completion_ids for r in redo.rollouts] == first["completion_ids"]
            assert service.info().settled == settled == 2 * len(ROWS) * GENERATIONS + 2
        finally:
            server.close()

    records = {r["id"]: r for r in read_jsonl(tmp_path / "data" / "served" / "trajectories.jsonl")}
    assert [step for step, _ in given] == [0, 1]
    for step, out in given:
        assert set(out["policy_version"]) == {step} and len(out["rollout_id"]) == len(ROWS) * GENERATIONS
        for i, rid in enumerate(out["rollout_id"]):
            record = records[rid.split("/", 1)[1]]
            assert record["metadata"]["dataset"]["policy_version"] == step  # stamped with the trainer's step
            assert record["metadata"]["model"] == f"local:policy-v{step:06d}"  # served by that step's weights
            [segment] = TokenTrace.read(record["tokens"]).rows()
            assert out["prompt_ids"][i] + out["completion_ids"][i] == segment["input_ids"]  # the server's ids, unchanged
            assert out["env_mask"][i] == segment["loss_mask"][len(out["prompt_ids"][i]):]
            verdict = record["verification"]
            expected = verdict["score"] if verdict["status"] in ("pass", "fail") else None
            assert seen[rid] == out["hermes_reward"][i] == expected  # the reward TRL saw is the check's score
    assert all(g <= 5e-3 for g in gaps), gaps  # the service serves the trainer's weights of each step
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(float(x)) for x in losses)
    assert max((trainer.model.state_dict()[k] - v).abs().max().item() for k, v in initial.items()) > 1e-3
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps  # the service's sandboxes and model server are gone with it


def test_the_embedded_server_swaps_weights_even_while_it_restarts_after_a_crash_and_keeps_the_old_on_a_bad_file(tmp_path):
    """The rollout service's reload (LocalModelServer.reload), on the real llama.cpp server: asked
    while the watcher restarts a crashed server, it waits for that start and then swaps; a file that
    cannot load leaves the old weights served."""
    needs_rl()
    import httpx

    from hermes_batch.llm.local_model import LocalModelError, LocalModelServer
    from hermes_batch.rollout import write_gguf
    from tests import tiny_policy

    vocabulary = tiny_policy.vocabulary_gguf(tmp_path / "vocab.gguf")
    first, second = (write_gguf(tiny_policy.policy(seed), tmp_path / f"w{seed}.gguf", vocabulary) for seed in (0, 1))
    (tmp_path / "broken.gguf").write_bytes(b"not a GGUF file")
    events = []
    with LocalModelServer(first, threads=1, ctx=1024, parallel=2, log_path=tmp_path / "server.log",
                          on_event=events.append) as server:
        base = server.url.removesuffix("/v1")
        served = lambda: httpx.get(f"{base}/props", timeout=30).json()["model_path"]  # noqa: E731
        server.share_opening([{"role": "user", "content": "hi"}], [])
        assert served() == str(first)
        crashed = server.pid
        os.kill(crashed, signal.SIGKILL)  # crashed: its watcher starts it again
        deadline = time.monotonic() + 30
        while server.pid in (crashed, None) and time.monotonic() < deadline:
            time.sleep(0.005)
        server.reload(second)  # while that start loads its weights
        assert served() == str(second) and server.url.removesuffix("/v1") == base  # the new weights, on the same port
        with pytest.raises(LocalModelError, match="failed"):
            server.reload(tmp_path / "broken.gguf")
        assert served() == str(second)
        server.reload(first)  # and it swaps again after a failed one
        assert served() == str(first)
    assert not any("giving up" in e for e in events), events


def fingerprint_of(state: dict, tiny_policy, fingerprint) -> str:
    """The fingerprint a policy with these weights has (the trainer's, restarted from its checkpoint)."""
    restarted = tiny_policy.policy()
    restarted.load_state_dict(state)
    return fingerprint(restarted)


def _prompt_id(records: dict, prompt: str) -> str:
    for r in records.values():
        if r["conversations"][1]["value"] == prompt:
            return r["prompt_id"]
    raise AssertionError(f"no record of {prompt!r}")


def test_a_rollout_of_several_calls_masks_what_the_model_did_not_write(tmp_path):
    """A trajectory of two model calls with a tool result between them is one sequence: the tool
    result and the next turn's opening are in the completion, masked out of training."""
    from hermes_batch.rollout.engine import _rollout
    from hermes_batch.tokens import TokenTrace
    from hermes_batch.tokens.trace import TokenCall

    trace = TokenTrace(calls=[TokenCall(0, [1, 2, 3], [10, 11], [-0.5, -0.25]),
                              TokenCall(0, [4, 5], [12], [float("nan")])])
    record = {"id": "p#1", "verification": {"status": "pass", "score": 1.0}, "tokens": trace.to_json()}
    r = _rollout("p#1", "p", 1, 7, {"p#1": record}, {})
    assert r.prompt_ids == [1, 2, 3] and r.completion_ids == [10, 11, 4, 5, 12]
    assert r.env_mask == [1, 1, 0, 0, 1] and r.reward == 1.0 and r.policy_version == 7
    assert r.logprobs[:4] == [-0.5, -0.25, 0.0, 0.0] and math.isnan(r.logprobs[4])
    # a history cut into two segments is no one sequence: it keeps no reward
    trace.calls.append(TokenCall(1, [1, 2], [13], [-1.0]))
    record["tokens"] = trace.to_json()
    cut = _rollout("p#1", "p", 1, 7, {"p#1": record}, {})
    assert not cut.usable and cut.reward is None and "2 token segments" in (cut.error or "")
    # a sample that failed has no trajectory, and says why
    gone = _rollout("p#2", "p", 2, 7, {}, {"p#2": {"id": "p#2", "error_kind": "timeout"}})
    assert not gone.usable and gone.reward is None and "timeout" in (gone.error or "")
    json.dumps(gone.__dict__)


def test_a_sequence_that_may_hold_a_control_token_where_text_belongs_never_reaches_a_trainer(tmp_path):
    """A review: the export refused a trajectory whose text holds a turn token, while the engine, TRL
    and the rollout service handed its sequence to the trainer. Ids made with every message's text
    as text (each call checked) are a sequence like any other; ids made otherwise (here as the runner
    made them before: the file's text parsed into control tokens) are refused, saying why, with no
    reward, by the engine, the service and so TRL."""
    from hermes_batch.rollout.engine import _rollout, make_step
    from hermes_batch.rollout.service.rollouts import _from_record
    from hermes_batch.rollout.service.steps import ServiceRollouts
    from hermes_batch.rollout.service.wire import RolloutRequest
    from hermes_batch.rollout.trl import _for_trl
    from hermes_batch.tokens import TokenTrace
    from tests.llamacpp_double import SPECIAL, LlamaCppDouble, detokenize, tokenize
    from tests.test_tokens import forged_file_rows, run_exact

    with LlamaCppDouble() as double:
        _, [record] = run_exact(tmp_path, double, forged_file_rows(), max_turns=3)
    rid = record["id"]
    old = copy.deepcopy(record)
    trace = TokenTrace.read(old["tokens"])
    for call in trace.calls:  # the rendering's special tokens parsed wherever they stood, the file's text too
        call.added = tokenize(detokenize(call.added))
    trace.plain_text = False
    old["tokens"] = trace.to_json()
    assert trace.sequence().count(SPECIAL["<|im_start|>"]) == 5 + 2  # five turns, two forged

    exact, forged = _rollout(rid, "p", 0, 1, {rid: record}, {}), _rollout(rid, "p", 1, 1, {rid: old}, {})
    assert not forged.usable and forged.reward is None and not forged.completion_ids
    assert "control token <|im_end|>" in (forged.error or ""), forged.error
    assert exact.usable and exact.reward == 1.0
    assert exact.prompt_ids + exact.completion_ids == TokenTrace.read(record["tokens"]).sequence()
    step = make_step(1, [[exact, forged]], "sample", False, None, "test")
    columns = _for_trl(step, eos=SPECIAL["<|endoftext|>"])
    assert columns["hermes_reward"] == [1.0, None] and columns["completion_ids"][1] == [SPECIAL["<|endoftext|>"]]

    req = RolloutRequest(rollout_id="r1", task="p")
    served, refused = _from_record(req, record), _from_record(req, old)
    assert served.reward == 1.0 and len(served.turns) == 2
    assert refused.state == "done" and refused.turns == [] and refused.reward is None
    assert "control token <|im_end|>" in (refused.error or "")
    trained = ServiceRollouts._rollout(req, 0, refused)  # what a trainer on the service gets: no sequence, the reason
    assert not trained.usable and trained.reward is None and trained.error == refused.error


STEP = """
import json, sys
from hermes_batch.rollout import Rollouts

if __name__ == "__main__":
    dataset, out, url, sandboxes = sys.argv[1:]
    rollouts = Rollouts(dataset, run_name="rl", output_dir=out, model="double", api_key="k", base_url=url,
                        toolsets=["terminal"], require_reasoning=False, num_workers=2, concurrency=4,
                        sandbox_root=sandboxes)
    step = rollouts.run([p for p in rollouts.prompts for _ in range(4)], 5)
    print(json.dumps([[r.rollout_id, r.reward, r.prompt_ids + r.completion_ids] for r in step.rollouts]))
"""


def test_a_trainer_killed_mid_step_gets_the_finished_rollouts_back_and_only_the_rest_run(tmp_path):
    """kill -9 in the middle of a step, then the same step asked again (a trainer restarted from its
    checkpoint): every rollout once, those finished before the kill returned as they were written."""
    from tests.llamacpp_double import LlamaCppDouble
    from tests.test_crash_safety import batch_ids, wait_for_records
    from tests.test_tokens import echoes

    data = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": echoes(2, answer=f"done {i}"), "expected": f"done {i}"}
                                               for i in range(6)])
    (tmp_path / "step.py").write_text(STEP)
    step_dir = tmp_path / "out" / "rl" / "steps" / "000005-train-0"
    with LlamaCppDouble(latency=0.15) as double:
        argv = [sys.executable, str(tmp_path / "step.py"), str(data), str(tmp_path / "out"), double.base_url,
                str(tmp_path / "sandboxes")]
        proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for_records(step_dir, 6, proc, timeout=120)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        before = {r["id"]: r for f in step_dir.glob("batch_*.jsonl") for r in read_jsonl(f)}
        assert 6 <= len(before) < 24
        again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    rollouts = json.loads(again.stdout.strip().splitlines()[-1])
    assert len(rollouts) == 24 and len({rid for rid, _, _ in rollouts}) == 24
    assert all(reward == 1.0 for _, reward, _ in rollouts)  # each answered its own prompt
    assert max(batch_ids(step_dir).values()) == 1  # no rollout written twice
    records = {r["id"]: r for r in read_jsonl(step_dir / "trajectories.jsonl")}
    for rid, record in before.items():  # finished before the kill: kept, not run again
        assert records[rid]["metadata"]["timestamp"] == record["metadata"]["timestamp"]
    for rid, _, ids in rollouts:
        assert record_ids(records[rid.split("/", 1)[-1]]) == ids


TRAINER = """
import json, os, sys
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from trl import GRPOConfig, GRPOTrainer
    from hermes_batch.rollout.trl import TRLRollouts
    from tests import tiny_policy

    dataset, out, url, sandboxes, life = sys.argv[1:]
    out = Path(out)
    if dataset == "-":  # the rollout service at url, its token in HERMES_BATCH_SERVE_TOKEN
        env = TRLRollouts.on_service(url, timeout=300)
    else:
        env = TRLRollouts(dataset, run_name="rl", output_dir=out, model="double", api_key="k", base_url=url,
                          toolsets=["terminal"], num_workers=1, concurrency=1, sandbox_root=sandboxes)

    def rollout(prompts, trainer):
        with (out / "asked.jsonl").open("a") as f:
            f.write(json.dumps({"life": life, "step": trainer.state.global_step, "prompts": prompts}) + "\\n")
        given = env.rollout_func(prompts, trainer)
        with (out / "given.jsonl").open("a") as f:
            f.write(json.dumps({"life": life, "step": trainer.state.global_step, **given}) + "\\n")
        return given

    args = GRPOConfig(output_dir=str(out / "trainer"), per_device_train_batch_size=4, num_generations=2, max_steps=2,
                      learning_rate=0.01, use_cpu=True, report_to=[], temperature=1.0, beta=0.0, seed=0,
                      save_strategy="steps", save_steps=1)
    trainer = GRPOTrainer(model=tiny_policy.policy(), processing_class=tiny_policy.tokenizer(), args=args,
                          train_dataset=env.dataset(), reward_funcs=env.reward, rollout_func=rollout)
    trainer.train(resume_from_checkpoint=life == "resumed" or None)
"""


@pytest.mark.parametrize("engine", ["own runs", "service"])
def test_a_trainer_resumed_from_its_checkpoint_mid_step_gets_its_finished_rollouts_back_once(tmp_path, engine):
    """From a review: GRPO killed during a step and restarted with resume_from_checkpoint=True ran
    the whole step again (its run then held a record too many for each rollout it had finished):
    TRL hands a resumed step's prompts in another order, and each rollout was keyed by its place in
    the batch. Through TRL's own resume: a trainer killed with kill -9 once step 1 has a rollout
    settled, then started again from its checkpoint, on steps of its own and on a rollout service."""
    needs_rl()
    import contextlib

    from hermes_batch.rollout import RolloutService, ServiceServer
    from hermes_batch.rollout.service.http_api import TOKEN_VARIABLE
    from tests.conftest import ROOT
    from tests.llamacpp_double import LlamaCppDouble
    from tests.test_crash_safety import batch_ids, wait_for_records
    from tests.test_tokens import echoes

    data = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": echoes(1, answer=f"done {i}"), "expected": f"done {i}"}
                                               for i in range(2)])
    (tmp_path / "train.py").write_text(TRAINER)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with LlamaCppDouble(latency=0.3) as double, contextlib.ExitStack() as stack:
        argv = [sys.executable, str(tmp_path / "train.py"), str(data), str(out), double.base_url,
                str(tmp_path / "sandboxes")]
        run = out / "rl" / "steps" / "000001-train-0"  # step 1's own run
        if engine == "service":
            service = stack.enter_context(RolloutService(
                data, run_name="served", output_dir=tmp_path / "data", model="double", base_url=double.base_url,
                api_key="k", toolsets="terminal", num_workers=1, concurrency=1, sandbox_root=str(tmp_path / "sb")))
            server = ServiceServer(service).start()
            stack.callback(server.close)
            argv[2:4] = ["-", str(out)]
            argv[4] = server.url
            env[TOKEN_VARIABLE] = server.token
            run = tmp_path / "data" / "served"
        with open(tmp_path / "first.log", "w") as log:
            first = subprocess.Popen([*argv, "first"], start_new_session=True, env=env, stdout=log, stderr=log)
        try:  # killed once step 1 (4 rollouts, after step 0's 4) has one settled
            wait_for_records(run, 1 if engine != "service" else 5, first, timeout=300)
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        before = {}  # what the killed life wrote whole (a line the kill cut is no record)
        for line in (line for f in run.glob("batch_*.jsonl") for line in f.read_text().splitlines()):
            with contextlib.suppress(ValueError):
                before[json.loads(line)["id"]] = json.loads(line)
        calls = len(double.completions())
        again = subprocess.run([*argv, "resumed"], env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        calls_again = len(double.completions()) - calls
    asked = {(a["life"], a["step"]): a["prompts"] for a in read_jsonl(out / "asked.jsonl")}
    assert sorted(asked) == [("first", 0), ("first", 1), ("resumed", 1)]  # the step it was killed in, again
    # TRL seeds its sampler afresh on a resume: the step's prompts come in another order
    assert asked["first", 1] != asked["resumed", 1] and sorted(asked["first", 1]) == sorted(asked["resumed", 1])
    [given] = [g for g in read_jsonl(out / "given.jsonl") if g["life"] == "resumed"]
    records = {r["id"]: r for r in read_jsonl(run / "trajectories.jsonl")}
    ids = [rid.split("/", 1)[1] for rid in given["rollout_id"]]
    assert len(set(ids)) == 4 and max(batch_ids(run).values()) == 1  # each rollout once, each record written once
    if engine == "service":
        assert len(records) == 8 and calls + calls_again == 2 * 8  # none of either step run twice
    else:
        finished = [rid for rid in before if rid in ids]
        assert sorted(records) == sorted(ids) and finished and calls_again == 2 * (4 - len(finished))
        for rid in finished:  # settled before the kill: handed back as written, not run again
            assert records[rid]["metadata"]["timestamp"] == before[rid]["metadata"]["timestamp"]
    for i, rid in enumerate(ids):  # in the order TRL handed the prompts, each the rollout of its prompt
        assert records[rid]["conversations"][1]["value"] == asked["resumed", 1][i]
        assert given["prompt_ids"][i] + given["completion_ids"][i] == record_ids(records[rid])


def record_ids(record: dict) -> list[int]:
    from hermes_batch.tokens import TokenTrace

    [segment] = TokenTrace.read(record["tokens"]).rows()
    return segment["input_ids"]


def test_a_group_with_an_unscored_sample_or_equal_rewards_is_masked_when_asked(tmp_path):
    """errored="group" takes the reward from every sample of a group in which one has none;
    drop_zero_variance from every sample of a group whose rewards are all equal; both are counted."""
    from hermes_batch.dataset import read_source
    from hermes_batch.record import sample_id
    from hermes_batch.rollout import Rollouts
    from hermes_batch.tokens import TokenTrace
    from hermes_batch.tokens.trace import TokenCall

    rows = write_jsonl(tmp_path / "000001.jsonl", [{"prompt": "a", "check": "true"}, {"prompt": "b", "check": "true"}])
    step_dir = tmp_path / "000001"
    step_dir.mkdir()
    ids = read_source(rows, step_dir).ids
    tokens = TokenTrace(calls=[TokenCall(0, [1, 2], [3], [-0.1])]).to_json()
    verdicts = {0: ["pass", "fail", "error"], 1: ["pass", "pass", "pass"]}
    write_jsonl(step_dir / "trajectories.jsonl", [
        {"id": sample_id(ids[g], s), "tokens": tokens,
         "verification": {"status": v, "score": None if v == "error" else float(v == "pass")}}
        for g, statuses in verdicts.items() for s, v in enumerate(statuses)])
    groups = [("a", 3), ("b", 3)]

    def step(**how):
        engine = Rollouts.__new__(Rollouts)
        engine.errored, engine.drop_zero_variance = how.get("errored", "sample"), how.get("drop_zero_variance", False)
        return engine._step(1, groups, rows, step_dir)

    plain = step()
    assert [r.reward for r in plain.rollouts] == [1.0, 0.0, None, 1.0, 1.0, 1.0]
    assert plain.zero_variance == 1 and plain.masked == 0
    whole = step(errored="group", drop_zero_variance=True)
    assert [r.reward for r in whole.rollouts] == [None] * 6 and whole.masked == 5


def test_a_step_asked_again_resumes_only_with_the_same_weights(tmp_path):
    """The same step of the same weights (a trainer restarted from its checkpoint) gets its rollouts
    back without a model call; other weights (a new training under the run's name) run afresh;
    evaluation and a second call at one global step are runs of their own."""
    from hermes_batch.rollout import Rollouts
    from tests.llamacpp_double import LlamaCppDouble
    from tests.test_tokens import echoes

    data = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": echoes(1, answer=f"done {i}"), "expected": f"done {i}"}
                                               for i in range(2)])
    with LlamaCppDouble() as double:
        def engine():
            return Rollouts(data, run_name="rl", output_dir=tmp_path / "out", model="double", api_key="k",
                            base_url=double.base_url, toolsets=["terminal"], num_workers=1,
                            sandbox_root=str(tmp_path / "sandboxes"))

        first = engine()
        prompts = [p for p in first.prompts for _ in range(2)]
        a = first.run(prompts, 3, policy="weights-a")
        calls = len(double.completions())
        again = engine().run(prompts, 3, policy="weights-a")  # a new process: the same step's run, resumed
        assert len(double.completions()) == calls and again.run_dir == a.run_dir
        assert [r.completion_ids for r in again.rollouts] == [r.completion_ids for r in a.rollouts]
        other = engine().run(prompts, 3, policy="weights-b")
        assert len(double.completions()) == 2 * calls and all(r.reward == 1.0 for r in other.rollouts)
        second = first.run(prompts, 3, policy="weights-a")  # a second generation at the same global step
        evaluation = first.run(prompts, 3, policy="weights-a", tag="eval")
    assert [a.run_dir.name, second.run_dir.name, evaluation.run_dir.name] == [
        "000003-train-0", "000003-train-1", "000003-eval-0"]
    assert len(double.completions()) == 4 * calls


def test_a_step_run_of_the_earlier_version_resumes_with_its_prompts_in_another_order(tmp_path):
    """A step's rows as the earlier version wrote them (each naming its group, its place in TRL's
    batch), then asked again in another order by a trainer restarted with the same weights: its
    rollouts come back without a model call, each its own prompt's, and its rows stay as written."""
    from hermes_batch.rollout import Rollouts
    from tests.llamacpp_double import LlamaCppDouble
    from tests.test_tokens import echoes

    data = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": echoes(1, answer=f"done {i}"), "expected": f"done {i}"}
                                               for i in range(3)])
    with LlamaCppDouble() as double:
        def engine():
            return Rollouts(data, run_name="rl", output_dir=tmp_path / "out", model="double", api_key="k",
                            base_url=double.base_url, toolsets=["terminal"], num_workers=1,
                            sandbox_root=str(tmp_path / "sandboxes"))

        first = engine()
        (first.run_dir / "steps").mkdir(parents=True)
        rows = write_jsonl(first.run_dir / "steps" / "000003-train-0.jsonl", [
            {**first.rows[p], "policy_version": 3, "policy": "w", "group": g} for g, p in enumerate(first.prompts)])
        written = rows.read_bytes()
        a = first.run([p for p in first.prompts for _ in range(2)], 3, policy="w")
        calls = len(double.completions())
        order = [2, 0, 1]
        b = engine().run([first.prompts[i] for i in order for _ in range(2)], 3, policy="w")
        assert len(double.completions()) == calls == 3 * 2 * 2
    assert rows.read_bytes() == written and a.run_dir == b.run_dir
    assert [(r.rollout_id, r.completion_ids) for r in b.rollouts] == [
        (r.rollout_id, r.completion_ids) for i in order for r in a.rollouts[2 * i:2 * i + 2]]
    assert all(r.reward == 1.0 for r in b.rollouts)  # each answered its own prompt


def test_each_version_s_weights_are_written_by_the_training_that_serves_them(tmp_path):
    """Weights files another training left (higher versions, an earlier run of the same name) are
    written over or removed, never served; the file served and the one before it stay."""
    needs_rl()
    from hermes_batch.rollout.trl import TRLRollouts
    from tests import tiny_policy

    env = TRLRollouts(write_jsonl(tmp_path / "rl.jsonl", ROWS), run_name="w", output_dir=tmp_path / "data",
                      vocabulary=tiny_policy.vocabulary_gguf(tmp_path / "vocab.gguf"), model="local")
    env.policy_dir.mkdir(parents=True)
    for stale in (3, 11, 12):
        (env.policy_dir / f"policy-v{stale:06d}.gguf").write_bytes(b"old")
    model = tiny_policy.policy()
    ten = env.weights(model, 10)
    assert ten.stat().st_size > 1000 and sorted(p.name for p in env.policy_dir.iterdir()) == ["policy-v000010.gguf"]
    eleven = env.weights(model, 11)
    assert eleven.stat().st_size > 1000 and ten.exists()
    env.weights(model, 12)
    assert sorted(p.name for p in env.policy_dir.iterdir()) == ["policy-v000011.gguf", "policy-v000012.gguf"]
