"""The rollout service (`python batch_runner.py serve`, hermes_batch/rollout/service/rollouts.py): rollout
requests over HTTP on loopback, each run through the real local jail, agent loop and check,
token-exact against a loopback double of llama.cpp's server; killed with kill -9 mid-group and
started again, it loses no acknowledged rollout and runs none twice."""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest

from hermes_batch.rollout.service.http_api import TOKEN_FILE, TOKEN_VARIABLE, ServiceClient, ServiceServer, is_loopback
from hermes_batch.rollout.service.rollouts import REQUESTS, RolloutService, wait_for
from hermes_batch.rollout.service.wire import Policy, RequestRefused, RolloutRequest
from hermes_batch.tokens import TokenTrace
from tests.conftest import ROOT, ledger_ids, read_jsonl, write_jsonl
from tests.llamacpp_double import LlamaCppDouble
from tests.scripted_model import script

WRITE = script({"calls": [["terminal", {"command": "echo hi > out.txt"}]]}, {"answer": "done"}, text="Write hi.")
IDLE = script({"answer": "nothing"}, text="Do nothing.")
ROWS = [{"prompt": WRITE, "check": "grep -q hi out.txt"}, {"prompt": IDLE, "check": "test -f out.txt"},
        {"prompt": script({"answer": "x"}, text="Unchecked.")}]


def service(tmp_path, double, **flags) -> RolloutService:
    return RolloutService(write_jsonl(tmp_path / "tasks.jsonl", ROWS), run_name="online", output_dir=tmp_path / "data",
                          model="double", base_url=double.base_url, api_key="k", toolsets="terminal", num_workers=1,
                          sandbox_root=str(tmp_path / "sandboxes"), **flags)


def kept(tmp_path) -> dict[str, dict]:
    """The service's run's trajectories, by rollout id."""
    return {r["id"]: r for r in read_jsonl(tmp_path / "data" / "online" / "trajectories.jsonl")}


def test_rollouts_over_http_carry_the_servers_tokens_the_checks_reward_and_their_policy_version(tmp_path):
    with LlamaCppDouble(gaps=True) as double, service(tmp_path, double) as svc:
        server = ServiceServer(svc).start()
        client = ServiceClient(server.url, token=server.token)
        auth = {"Authorization": f"Bearer {server.token}"}
        try:
            asked = [RolloutRequest(rollout_id=f"g0-{s}", task=WRITE, model="policy-v3", policy_version=3, seed=0)
                     for s in range(3)]
            for req in asked:
                assert client.submit(req).state in ("queued", "running")
            assert client.set_policy(Policy(version=4)).version == 4  # the trainer's policy now: for what names none
            asked += [RolloutRequest(rollout_id=f"g1-{s}", task=IDLE, seed=1) for s in range(3)]
            asked.append(RolloutRequest(rollout_id="u", task=svc.dataset.ids[2]))  # by prompt id
            for req in asked[3:]:
                assert client.submit(req).state in ("queued", "running")
            results = {req.rollout_id: wait_for(client, req.rollout_id, timeout=120) for req in asked}
            assert client.submit(asked[0]).state == "done"  # the same id again: that rollout, not a new one
            with pytest.raises(RequestRefused) as conflict:
                client.submit(asked[0].model_copy(update={"policy_version": 9}))
            assert conflict.value.status == 409
            assert client.submit(asked[-1].model_copy(update={"task": svc.by_id[svc.dataset.ids[2]].prompt})).state == "done"
            with pytest.raises(RequestRefused) as unknown:
                client.submit(RolloutRequest(rollout_id="x", task="a prompt the dataset does not have"))
            assert unknown.value.status == 404 and "no prompt id or prompt" in str(unknown.value)
            bad = httpx.post(f"{server.url}/v1/rollouts", json={"rollout_id": "y"}, headers=auth)
            assert bad.status_code == 400 and "task" in bad.json()["error"]
            # weights are a file name of the embedded model's policy directory, never a path
            bad = httpx.post(f"{server.url}/v1/rollouts", json={"rollout_id": "y", "task": IDLE, "weights": "../x.gguf"},
                             headers=auth)
            assert bad.status_code == 400 and "weights" in bad.json()["error"]
            with pytest.raises(RequestRefused) as not_embedded:
                client.set_policy(Policy(version=5, weights="policy-v000005.gguf"))
            assert not_embedded.value.status == 400 and "not the embedded one" in str(not_embedded.value)
            with pytest.raises(KeyError):
                client.result("never-asked")
            info = client.info()
            assert info.settled == 7 and info.queued == info.running == 0 and info.tasks == 3
            assert [t.prompt_id for t in client.tasks().tasks] == svc.dataset.ids  # a trainer's dataset, in order
        finally:
            client.close()
            server.close()
        sent = double.completions()
    records = kept(tmp_path)
    gaps = 0
    assert sorted(records) == sorted(results) and len(sent) == 3 * 2 + 3 + 1  # each rollout once, no more calls
    for rid, result in results.items():
        record = records[rid]
        assert result.state == "done" and result.prompt_id == record["prompt_id"]
        assert record["metadata"]["dataset"]["policy_version"] == result.policy_version == (3 if rid.startswith("g0") else 4)
        assert record["metadata"]["model"] == result.model == ("policy-v3" if rid.startswith("g0") else "double")
        score = record["verification"].get("score")
        assert result.reward == (None if rid == "u" else score) and result.verdict == record["verification"]["status"]
        trace = TokenTrace.read(record["tokens"])
        assert [t.completion_ids for t in result.turns] == [c.completion for c in trace.calls]
        for i, turn in enumerate(result.turns):  # what the server was sent and returned, unchanged
            assert turn.prompt_ids == trace.prompt_of(i) and turn.prompt_ids in [s["prompt"] for s in sent]
            assert len(turn.logprobs) == len(turn.completion_ids)  # None just where the server gave none (gaps)
            assert [lp is None for lp in turn.logprobs] == [math.isnan(lp) for lp in trace.calls[i].logprobs]
            gaps += turn.logprobs.count(None)
    assert gaps > 0 and {results[f"g0-{s}"].reward for s in range(3)} == {1.0} and {results[f"g1-{s}"].reward for s in range(3)} == {0.0}


def test_off_loopback_the_token_is_the_user_s_own(tmp_path):
    assert all(map(is_loopback, ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.0.0.1", "example.com")))
    with LlamaCppDouble() as double, service(tmp_path, double) as svc:
        with pytest.raises(Exception, match="HERMES_BATCH_SERVE_TOKEN"):
            ServiceServer(svc, host="0.0.0.0")
        server = ServiceServer(svc, token="s3cret").start()
        try:
            assert httpx.get(f"{server.url}/v1/info").status_code == 401
            assert httpx.get(f"{server.url}/v1/info", headers={"Authorization": "Bearer wrong"}).status_code == 401
            with ServiceClient(server.url, token="s3cret") as client:
                assert client.info().tasks == 3
        finally:
            server.close()


def _serve_args(tmp_path, double, port: int | str, *flags: str) -> list[str]:
    return [sys.executable, str(ROOT / "batch_runner.py"), "serve", f"--dataset_file={tmp_path / 'tasks.jsonl'}",
            "--run_name=online", f"--output_dir={tmp_path / 'data'}", "--model=double", f"--base_url={double.base_url}",
            "--api_key=k", "--toolsets=terminal", "--num_workers=2", "--concurrency=4",
            f"--sandbox_root={tmp_path / 'sandboxes'}", f"--port={port}", *flags]


def _serve(tmp_path, double, port: int, *flags: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VARIABLE}  # the service makes its own
    return subprocess.Popen(_serve_args(tmp_path, double, port, *flags), cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "serve.log", "a"), env=env)


def _up(url: str, proc: subprocess.Popen, run_dir, seconds: float = 60) -> ServiceClient:
    """A client of the service `proc` started, with the token it wrote in its run (as a trainer on
    the same machine finds it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the service exited"
        try:
            client = ServiceClient(url, token=(run_dir / TOKEN_FILE).read_text())
            client.info()
            return client
        except (httpx.TransportError, FileNotFoundError):
            time.sleep(0.2)
        except RequestRefused as exc:  # the token an earlier start of the service left, until it writes its own
            assert exc.status == 401, exc
            client.close()
            time.sleep(0.2)
    raise AssertionError("the service did not come up")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kill_9_mid_group_then_a_restart_loses_no_rollout_and_runs_none_twice(tmp_path):
    write_jsonl(tmp_path / "tasks.jsonl", ROWS)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    asked = [RolloutRequest(rollout_id=f"r{i}", task=WRITE if i % 2 else IDLE, policy_version=1) for i in range(12)]
    with LlamaCppDouble(latency=0.4) as double:
        first = _serve(tmp_path, double, port)
        try:
            client = _up(url, first, tmp_path / "data" / "online")
            token = tmp_path / "data" / "online" / TOKEN_FILE  # the one it made: said, and its user's only
            assert token.stat().st_mode & 0o777 == 0o600 and f"token: {token.read_text()} " in (tmp_path / "serve.log").read_text()
            assert httpx.post(f"{url}/v1/policy", json={"version": 7}).status_code == 401
            for req in asked:
                client.submit(req)
            deadline = time.monotonic() + 120
            while (done := client.info().settled) < 3:
                assert time.monotonic() < deadline, "no rollout settled"
                time.sleep(0.1)
            told = {r: client.result(r).state for r in (q.rollout_id for q in asked)}
            os.killpg(first.pid, signal.SIGKILL)  # the service and its workers, mid-group
            first.wait(10)
            client.close()
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        settled_before = {r for r, s in told.items() if s == "done"}
        assert 3 <= done and 0 < len(settled_before) < len(asked)
        calls_before = len(double.completions())

        second = _serve(tmp_path, double, port)
        try:
            client = _up(url, second, tmp_path / "data" / "online")
            for req in asked:  # a trainer that lost its answers asks again, with the same ids
                client.submit(req)
            results = {q.rollout_id: wait_for(client, q.rollout_id, timeout=120) for q in asked}
            client.close()
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(60)
        log = (tmp_path / "serve.log").read_text()
        assert second.returncode == 0, log[-2000:]
    run = tmp_path / "data" / "online"
    assert all(r.state == "done" for r in results.values()), {k: v.error for k, v in results.items()}
    assert Counter(ledger_ids(run)) == Counter(q.rollout_id for q in asked)  # each once: none lost, none twice
    records = read_jsonl(run / "trajectories.jsonl")
    assert sorted(r["id"] for r in records) == sorted(q.rollout_id for q in asked)
    rerun = len(double.completions()) - calls_before  # the second life asked only for what was not settled
    per = {q.rollout_id: 2 if q.task == WRITE else 1 for q in asked}
    assert rerun <= sum(n for r, n in per.items() if r not in settled_before)
    assert "run again" in log and not list((tmp_path / "sandboxes").glob("*/*"))
    assert json.loads((run / "statistics.json").read_text())["requests"] == len(asked)


def needs_openenv() -> None:
    from tests.backend_harness import unavailable

    for module in ("openenv", "trl"):
        try:
            __import__(module)
        except ImportError:
            unavailable("rl", f"{module} not installed (pip install -e '.[rl]')")


def test_openenv_sessions_keep_openenv_s_contract_and_trl_trains_on_their_traces(tmp_path):
    """The factory as TRL's AsyncGRPO harness worker calls it (with the policy's sampling), its
    sessions as the worker drives them (create, wait, trace, verify, close), their traces through
    openenv's own validators and TRL's own reconciliation into training rows."""
    needs_openenv()
    import functools

    from openenv.core.harness import ResourceSession, TrainableSession, TrainingTrace
    from openenv.core.harness.capture.upstream import training_sampling
    from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
    from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace

    from hermes_batch.rollout.openenv import HermesSessionFactory

    with LlamaCppDouble(gaps=True) as double, service(tmp_path, double) as svc:
        server = ServiceServer(svc).start()
        trainer = ServiceClient(server.url, token=server.token)
        try:
            trainer.set_policy(Policy(model="policy-v3", version=3))
            # TRL pickles the factory into the process its rollout loop runs in, then calls it there
            make = pickle.loads(pickle.dumps(functools.partial(HermesSessionFactory, server.url, max_staleness=1,
                                                               token=server.token)))
            with pytest.raises(ValueError, match="--temperature=0.7"):
                make(sampling=training_sampling({"temperature": 0.7}))  # the service samples at 1: not the policy's
            factory = make(sampling=training_sampling({"temperature": 1.0}))
            sessions = [factory.create([{"role": "system", "content": "x"}, {"role": "user", "content": WRITE}],
                                       seed=0, episode_id=f"w{i}") for i in range(2)]
            sessions.append(factory.create({"prompt": IDLE}, seed=1, episode_id="idle"))
            trainer.set_policy(Policy(model="policy-v4", version=4))  # moved on while they ran: one behind is in bound
            traces = {}
            for session in sessions:
                assert isinstance(session, TrainableSession) and isinstance(session, ResourceSession)
                assert session.wait_for_completion(timeout_s=120) == 0
                trace = session.fetch_training_trace()
                TrainingTrace.model_validate_json(trace.model_dump_json())  # openenv's strict schema and validators
                traces[session.request.rollout_id] = trace
                verified = session.verify([])
                assert verified.env_reward == (1.0 if session.prompt == WRITE else 0.0) and not verified.metrics["stale"]
                session.close()
            trainer.set_policy(Policy(model="policy-v6", version=6))
            stale = sessions[0].verify([])
            assert stale.env_reward is None and stale.metrics["stale"] and stale.metrics["staleness"] == 3
            late = factory.create(IDLE, episode_id="cancelled")
            late.close()  # closed before it was waited for: dropped if it had not started, else run to its end
            assert svc.result("cancelled", wait=60).state in ("failed", "done")
        finally:
            trainer.close()
            server.close()
        sent = double.completions()
    records = kept(tmp_path)
    masked = 0
    for rid, trace in traces.items():
        record = records[rid]
        assert record["metadata"]["model"] == "policy-v3" and record["metadata"]["dataset"]["policy_version"] == 3
        calls = TokenTrace.read(record["tokens"]).calls
        assert [t.completion_token_ids for t in trace.turns] == [c.completion for c in calls]
        assert all(t.prompt_token_ids in [s["prompt"] for s in sent] for t in trace.turns)  # as the server got them
        for turn, call in zip(trace.turns, calls, strict=True):
            given = [not math.isnan(lp) for lp in call.logprobs]  # a token without one is context, not trained
            assert turn.loss_mask == [0] * len(turn.prompt_token_ids) + [int(g) for g in given]
            masked += given.count(False)
        [row], tally = _chain_to_sequences(_turns_from_training_trace(trace), rid, 0)
        sequence = TokenTrace.read(record["tokens"]).rows()[0]  # TRL's one row is the record's sequence, exactly
        assert row.input_ids == sequence["input_ids"] and tally["fork"] == 0
        assert sum(row.completion_mask) == sum(sequence["loss_mask"]) - sum(
            math.isnan(lp) for c in calls for lp in c.logprobs)
    assert masked > 0


def test_a_chat_endpoint_is_asked_for_the_model_each_rollout_names(tmp_path):
    """A trainer's versions as vLLM serves them, adapters by name: each rollout's calls ask for its
    own (the service's --model for a rollout that names none), and its record says which."""
    from tests.scripted_model import ScriptedModel

    with ScriptedModel() as chat:
        svc = RolloutService(write_jsonl(tmp_path / "tasks.jsonl", ROWS), run_name="chat", output_dir=tmp_path / "data",
                             model="base", base_url=chat.base_url, api_key="k", toolsets="terminal", tokens="off",
                             num_workers=1, sandbox_root=str(tmp_path / "sandboxes"))
        with svc:
            for rid, model in (("a", "policy-v1"), ("b", "policy-v2"), ("c", None)):
                svc.submit(RolloutRequest(rollout_id=rid, task=WRITE, model=model, policy_version=int(rid != "c")))
            results = {rid: wait_for(svc, rid, timeout=60) for rid in "abc"}
        asked = Counter(body["model"] for body in chat.requests)
    assert asked == {"policy-v1": 2, "policy-v2": 2, "base": 2}  # two calls each, each to its own model
    assert [results[r].model for r in "abc"] == ["policy-v1", "policy-v2", "base"]
    assert all(r.turns == [] and r.reward == 1.0 for r in results.values())  # no token data asked: no turns


def test_after_a_restart_failed_rollouts_stay_failed_and_a_torn_request_line_costs_nothing(tmp_path):
    """From a review: a cancelled (failed) rollout, already told to the trainer, ran again at every
    start; and a request written after a torn last line was lost at the next."""
    with LlamaCppDouble() as double:
        with service(tmp_path, double, concurrency=1) as svc:
            svc.submit(RolloutRequest(rollout_id="a", task=WRITE))
            svc.submit(RolloutRequest(rollout_id="c", task=IDLE))
            svc.cancel("c")  # behind "a" with one rollout in flight: still queued, so dropped
            assert wait_for(svc, "c", 60).state == "failed" and wait_for(svc, "a", 60).state == "done"
        calls = len(double.completions())
        requests = tmp_path / "data" / "online" / REQUESTS
        with requests.open("ab") as f:
            f.write(b'{"rollout_id": "torn", "ta')  # a write cut short: never acknowledged
        with service(tmp_path, double) as svc:
            assert svc.result("c").state == "failed" and "cancelled" in svc.result("c").error
            svc.submit(RolloutRequest(rollout_id="b", task=IDLE))
            assert wait_for(svc, "b", 60).state == "done"
            with pytest.raises(KeyError):
                svc.result("torn")
        with service(tmp_path, double) as svc:  # the request after the torn line survived it
            assert svc.result("b").state == "done" and svc.result("a").state == "done"
        assert len(double.completions()) == calls + 1  # only "b" was run: "c" was not, nor "a" again
    run = tmp_path / "data" / "online"
    assert Counter(ledger_ids(run)) == Counter({"a": 1, "b": 1}) and ledger_ids(run, "f") == ["c"]


def test_the_queue_is_bounded_and_a_sample_is_one_rollout(tmp_path):
    with LlamaCppDouble(latency=1.0) as double:
        with pytest.raises(Exception, match="--samples"):
            service(tmp_path, double, samples=4)
        with service(tmp_path, double, concurrency=1, max_queued=2) as svc:
            svc.submit(RolloutRequest(rollout_id="q0", task=IDLE))
            deadline = time.monotonic() + 30
            while svc.result("q0").state == "queued":  # the one rollout in flight
                assert time.monotonic() < deadline
                time.sleep(0.05)
            answers = ["running"]
            for i in range(1, 6):
                try:
                    answers.append(svc.submit(RolloutRequest(rollout_id=f"q{i}", task=IDLE)).state)
                except RequestRefused as exc:
                    answers.append(exc.status)
            assert answers == ["running", "queued", "queued", 429, 429, 429], answers  # 1 in flight, 2 waiting
            accepted = [f"q{i}" for i, a in enumerate(answers) if a != 429]
            assert all(wait_for(svc, rid, 60).state == "done" for rid in accepted)
        seeds = {body.get("seed") for body in double.completions()}
    assert seeds == {None}  # each rollout its own draw: none is handed its task's sample-0 seed


def test_http_keeps_in_step_after_a_refusal_and_refuses_a_bad_length(tmp_path):
    """From a review: a refused POST's body was left unread, and the next request on the same
    connection was answered 501; a bad Content-Length got no answer at all."""
    with LlamaCppDouble() as double, service(tmp_path, double) as svc:
        server = ServiceServer(svc).start()
        try:
            auth = {"Authorization": f"Bearer {server.token}"}
            with httpx.Client(base_url=server.url, headers=auth) as http:  # one kept-alive connection
                assert http.post("/v1/nowhere", json={"rollout_id": "a", "task": WRITE}).status_code == 404
                assert http.get("/v1/info").status_code == 200
            host, port = server.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n"
                             + f"Authorization: Bearer {server.token}\r\n\r\n".encode())
                assert sock.recv(100).startswith(b"HTTP/1.1 400")
            big = httpx.post(f"{server.url}/v1/rollouts", content=b"x" * ((1 << 20) + 1), headers=auth)
            assert big.status_code == 413
        finally:
            server.close()


def test_a_cancel_frees_its_place_at_once_a_spent_budget_settles_the_waiting_and_the_policy_outlives_a_restart(
        tmp_path):
    """From a second review: a cancelled rollout held its queue place until a running one ended;
    once the budget was spent, queued rollouts were never settled (a trainer waited forever); a
    retry that names no model was refused (409) once the policy moved; the policy was forgotten
    at a restart, so new rollouts were served by the base model, stamped version 0."""
    with LlamaCppDouble(latency=2.0) as double:
        with service(tmp_path, double, concurrency=1, max_queued=2) as svc:
            svc.set_policy(Policy(model="policy-v2", version=2))
            svc.submit(RolloutRequest(rollout_id="q0", task=IDLE))
            while svc.result("q0").state == "queued":
                time.sleep(0.05)
            svc.submit(RolloutRequest(rollout_id="q1", task=IDLE))
            svc.submit(RolloutRequest(rollout_id="q2", task=IDLE))
            svc.cancel("q1")
            assert wait_for(svc, "q1", 1.5).state == "failed"  # at once: q0 runs on for 2 s
            assert svc.submit(RolloutRequest(rollout_id="q3", task=IDLE)).state == "queued"  # its place is free
            svc.set_policy(Policy(model="policy-v3", version=3))
            again = svc.submit(RolloutRequest(rollout_id="q2", task=IDLE))  # a retry, as create() sends it
            assert again.model == "policy-v2" and again.policy_version == 2
            assert {wait_for(svc, r, 60).policy_version for r in ("q0", "q2", "q3")} == {2}
        with service(tmp_path, double, concurrency=1, max_queued=2) as svc:
            assert svc.info().policy == Policy(model="policy-v3", version=3)
            assert wait_for(svc, svc.submit(RolloutRequest(rollout_id="n", task=IDLE)).rollout_id, 60).model == "policy-v3"
    (tmp_path / "b").mkdir()
    with LlamaCppDouble(latency=1.0) as double, service(tmp_path / "b", double, concurrency=1,
                                                         max_total_tokens=1) as svc:
        for rid in ("b0", "b1", "b2"):
            svc.submit(RolloutRequest(rollout_id=rid, task=IDLE))
        assert wait_for(svc, "b0", 60).state == "done"  # the one in flight finishes; then the budget is spent
        for rid in ("b1", "b2"):
            late = wait_for(svc, rid, 30)
            assert late.state == "failed" and "budget" in late.error
        with pytest.raises(RequestRefused) as spent:
            svc.submit(RolloutRequest(rollout_id="b3", task=IDLE))
        assert spent.value.status == 503


def test_a_request_that_cannot_be_written_is_refused_and_leaves_no_torn_line(tmp_path, monkeypatch):
    """From a second review: a failed write left half a line, and the next request, written after
    it, was lost at the next start (and then run twice)."""
    import errno

    import hermes_batch.rollout.service.rollouts as engine

    real_write, fails = os.write, [1]

    def write(fd, data):  # the disk fills mid-line, once, for the requests file only
        if fails and os.readlink(f"/proc/self/fd/{fd}").endswith(REQUESTS):
            fails.pop()
            real_write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    with LlamaCppDouble() as double:
        with service(tmp_path, double) as svc:
            monkeypatch.setattr(engine.os, "write", write)
            with pytest.raises(RequestRefused) as full:
                svc.submit(RolloutRequest(rollout_id="a", task=IDLE))
            assert full.value.status == 507 and "No space left" in str(full.value)
            svc.submit(RolloutRequest(rollout_id="b", task=IDLE))
            monkeypatch.undo()
            assert wait_for(svc, "b", 60).state == "done"
        with service(tmp_path, double) as svc:
            assert svc.result("b").state == "done"
            with pytest.raises(KeyError):
                svc.result("a")
    assert ledger_ids(tmp_path / "data" / "online") == ["b"]


def test_a_trainer_is_refused_clearly_where_the_service_could_not_train_it(tmp_path):
    """TRL on a service: an embedded model's weights directory on another machine, or token data
    that is not exact, are said at once, not found out at the first step."""
    from hermes_batch.rollout.service.wire import ServiceInfo, TaskEntry, TaskList
    from hermes_batch.rollout.trl import TRLRollouts

    class Answers:  # what a service answers about itself
        def __init__(self, **info):
            self.given = {"run_name": "r", "model": "local:x", "temperature": 1.0, "tokens": "exact", "policy": Policy(),
                          "policy_dir": str(tmp_path), "queued": 0, "running": 0, "settled": 0, "tasks": 2, **info}

        def info(self):
            return ServiceInfo(**self.given)

        def tasks(self):
            return TaskList(tasks=[TaskEntry(prompt_id="a", prompt="p"), TaskEntry(prompt_id="b", prompt="p"),
                                   TaskEntry(prompt_id="c", prompt="q")])

    assert TRLRollouts.on_service(Answers()).engine.prompts == ["q"]  # "p" names two tasks: not addressable by prompt
    with pytest.raises(ValueError, match="not on this machine"):
        TRLRollouts.on_service(Answers(policy_dir="/nonexistent/policy"))
    with pytest.raises(ValueError, match="tokens=record"):
        TRLRollouts.on_service(Answers(tokens="record"))


ROUTES = [("GET", "/v1/info", None), ("GET", "/v1/tasks", None), ("GET", "/v1/rollouts/x?wait=1", None),
          ("DELETE", "/v1/rollouts/x", None), ("POST", "/v1/rollouts", {"rollout_id": "a", "task": IDLE}),
          ("POST", "/v1/policy", {"model": "steered", "version": 99}), ("GET", "/nowhere", None)]


def test_every_route_asks_for_the_token_on_loopback_too(tmp_path):
    """From a review: on loopback the service asked for no token, so a rollout's own agent read
    /v1/info and /v1/tasks, and POST /v1/policy changed the model and version of every later
    request that named none."""
    with LlamaCppDouble() as double, service(tmp_path, double) as svc:
        server = ServiceServer(svc).start()  # on loopback, no token given: it makes one
        try:
            for method, path, body in ROUTES:
                for headers in ({}, {"Authorization": "Bearer not-the-token"}):
                    res = httpx.request(method, server.url + path, json=body, headers=headers, timeout=10)
                    assert res.status_code == 401 and "token" in res.json()["error"], (method, path, res.text)
            assert svc.info().policy == Policy() and svc.info().queued == 0  # nothing was steered or asked
            assert len(server.token) >= 32
            with ServiceClient(server.url, token=server.token) as client:
                assert client.info().tasks == 3 and client.set_policy(Policy(version=2)).version == 2
        finally:
            server.close()


def test_half_sent_requests_hold_no_thread_and_keep_no_client_out(tmp_path):
    """From a review: the body (up to 1 MiB) was read before the token was checked, with no read
    timeout and no cap on connections: 200 half-sent requests held 200 threads (and 207 MiB) for
    over 150 s. Now a request without the token is answered 401 on its head, its body unread; a
    head must come whole within the head timeout; past the cap the connection waiting longest for
    its head is closed; and none of them holds a thread."""
    import threading

    with LlamaCppDouble() as double, service(tmp_path, double) as svc:
        threads = threading.active_count()
        server = ServiceServer(svc, head_timeout=3.0, max_connections=150).start()
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        held: list[socket.socket] = []
        try:
            for i in range(200):
                sock = socket.create_connection((host, int(port)), timeout=10)
                head = b"POST /v1/policy HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
                sock.sendall(head + (b"\r\n" + b"x" * 1000 if i % 2 else b""))  # half a head, or half a body
                held.append(sock)
            started = time.monotonic()
            for sock in held[1::2]:  # a whole head without the token: 401 at once, the body never waited for
                assert sock.recv(100).startswith(b"HTTP/1.1 401")
            assert threading.active_count() <= threads + 12  # not a thread per connection
            with ServiceClient(server.url, token=server.token, timeout=5) as client:
                asked = time.monotonic()
                assert client.info().tasks == 3 and time.monotonic() - asked < 2  # a trainer is not kept out
            assert server.open_connections <= 150
            for sock in held:  # every one closed by the server: refused, evicted or timed out
                while sock.recv(4096):
                    pass
            assert time.monotonic() - started < 3.0 + 5
            assert svc.info().policy == Policy()
        finally:
            for sock in held:
                sock.close()
            server.close()


def test_serve_says_a_bad_flag_at_start_and_takes_ipv6_loopback_for_loopback(tmp_path):
    """From a review: `serve --port=70000` printed a traceback after the workers had started;
    `--host=::1` was refused as reachable from other machines; a --tokenizer_file that is no
    tokenizer was found only when a worker crashed on it."""
    from hermes_batch.llm.local_model import TEMPLATES
    from tests.sglang_double import SGLangDouble

    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": "none of it"}')
    sglang = ["--token_server=sglang", f"--tokenizer_file={tmp_path / 'tokenizer.json'}",
              f"--chat_template_file={TEMPLATES / 'hermes-tools.jinja'}"]
    for n, (port, flags, said) in enumerate(((70000, [], "--port=70000: give a port from 1 to 65535"),
                                             ("http", [], "--port='http': give a port from 1 to 65535"),
                                             (_free_port(), sglang, "--tokenizer_file="))):
        where = tmp_path / str(n)
        where.mkdir()
        write_jsonl(where / "tasks.jsonl", ROWS)
        with SGLangDouble() as double:
            res = subprocess.run(_serve_args(where, double, port, *flags), cwd=where, capture_output=True, text=True,
                                 timeout=120)
            assert not double.generations()
        assert res.returncode != 0 and said in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr and "serving" not in res.stderr, res.stderr[-2000:]  # before the workers
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return  # no IPv6 on this machine's loopback
    write_jsonl(tmp_path / "tasks.jsonl", ROWS)
    port = _free_port()
    with LlamaCppDouble() as double:
        proc = _serve(tmp_path, double, port, "--host=::1")
        try:
            client = _up(f"http://[::1]:{port}", proc, tmp_path / "data" / "online")
            assert client.info().tasks == 3
            client.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, (tmp_path / "serve.log").read_text()[-2000:]
    assert not (tmp_path / "data" / "online" / TOKEN_FILE).exists()  # gone with the service
