"""`--executor=ray` against a real Ray cluster started on this host: a head and a second node as
separate `ray start` processes (tests/ray_cluster.py), the CLI run end to end with the scripted
model server; a node killed mid-run; nothing of Ray left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.backend_harness import unavailable
from tests.conftest import CLI, ledger_ids, read_jsonl, write_jsonl
from tests.ray_cluster import RayCluster
from tests.scripted_model import ScriptedModel, script

SECRET = "sk-ray-test-0123456789abcdef"


def _need_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        unavailable("ray", "Ray is not installed (pip install -e '.[ray]')")


@pytest.fixture(scope="module")
def cluster():
    _need_ray()
    temp = Path(tempfile.mkdtemp(prefix="hbray-", dir="/tmp"))
    c = RayCluster(temp)
    try:
        c.start(nodes=2)
    except Exception as exc:
        c.stop()
        unavailable("ray", f"cannot start a local Ray cluster: {exc}")
    yield c
    left = c.stop()
    shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"Ray processes still alive after the cluster was stopped: {sorted(left)}"


def _rows(n: int, tool_every: int = 2, check_every: int = 0) -> list[dict]:
    rows = [{"prompt": script(*([{"calls": [["terminal", {"command": f"echo node-{i} > out.txt"}]]}]
                                if i % tool_every == 0 else []),
                              {"answer": f"answer {i}"}, text=f"Ray task {i}.")} for i in range(n)]
    for i in range(0, n, check_every or n + 1):  # checked in the actor's own sandbox: out.txt is there for even i
        rows[i].update(check=f"grep -q node-{i} out.txt", expected=i)
    return rows


def _content(path: Path) -> list[dict]:
    """The records without what differs from one run to the next anyway: timestamps, durations,
    and the tool-call ids the model server makes up."""
    out = []
    for rec in read_jsonl(path):
        meta = {k: v for k, v in rec["metadata"].items()
                if k not in ("timestamp", "timings", "llm_calls", "llm_seconds", "tool_seconds")}
        verdict = {**rec["verification"], "seconds": None,
                   "checks": [{**c, "seconds": None} for c in rec["verification"]["checks"]]}
        text = json.dumps({**rec, "metadata": meta, "verification": verdict})
        ids = list(dict.fromkeys(re.findall(r"call_[0-9a-f]{16,32}", text)))
        for n, call_id in enumerate(ids):
            text = text.replace(call_id, f"call_{n}")
        out.append(json.loads(text))
    return out


def _cluster_tables(address: str, env: dict) -> tuple[dict, list]:
    """(actor table, job table) as the cluster's GCS holds them (what its dashboard would show)."""
    code = ("import ray, json; from ray._private import state; "
            f"ray.init(address='{address}', logging_level='ERROR'); "
            "print(json.dumps([state.actors(), state.jobs()], default=str))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    actors, jobs = json.loads(res.stdout.strip().splitlines()[-1])
    return actors, jobs


def _alive_loop_hosts(cluster: RayCluster) -> int:
    actors, _ = _cluster_tables(cluster.address, cluster.env)
    return sum(1 for a in actors.values() if a["ActorClassName"] == "LoopHost" and a["State"] == "ALIVE")


def test_a_run_spreads_over_the_nodes_and_writes_what_the_local_executor_writes(cluster, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", _rows(40, check_every=3))
    with ScriptedModel(latency=0.05) as model:
        (tmp_path / "ray").mkdir()
        (tmp_path / "local").mkdir()
        ray_cli, local_cli = CLI(tmp_path / "ray", model), CLI(tmp_path / "local", model)
        on_ray = ray_cli.run("same", data, executor="ray", ray_address=cluster.address, env=cluster.env, num_workers=4, concurrency=16,
                             toolsets="terminal", api_key=SECRET, timeout=300, samples=2)
        assert on_ray.returncode == 0, on_ray.stderr[-3000:]
        local = local_cli.run("same", data, num_workers=2, concurrency=16, toolsets="terminal", timeout=300, samples=2)
        assert local.returncode == 0, local.stderr[-3000:]
    assert "Ray: 4 actors on 2 node(s)" in on_ray.stderr
    per_node = re.search(r"Ray: prompts settled per node: (.*)", on_ray.stderr).group(1)
    assert len(per_node.split(",")) == 2, per_node  # both nodes ran prompts
    # the same records, statistics and checkpoint whichever executor ran them
    ray_dir, local_dir = ray_cli.run_dir("same"), local_cli.run_dir("same")
    assert _content(ray_dir / "trajectories.jsonl") == _content(local_dir / "trajectories.jsonl")
    ray_stats, local_stats = (json.loads((d / "statistics.json").read_text()) for d in (ray_dir, local_dir))
    for key in ("merged_trajectories", "completed", "api_calls", "tool_statistics", "tokens", "stop_reasons", "samples"):
        assert ray_stats[key] == local_stats[key], key
    verdicts = Counter(r["verification"]["status"] for r in read_jsonl(ray_dir / "trajectories.jsonl"))
    assert verdicts == {"skipped": 52, "pass": 14, "fail": 14}, verdicts  # rows 0, 3, ..., 39 (twice each): the even ones wrote out.txt
    assert ray_stats["samples"]["samples_scored"] == 28 and ray_stats["samples"]["pass@k"]["2"] == 0.5
    timing = ("check_seconds_p50", "check_seconds_p95")
    assert {k: v for k, v in ray_stats["verification"].items() if k not in timing} == \
        {k: v for k, v in local_stats["verification"].items() if k not in timing}
    ray_ckpt, local_ckpt = (json.loads((d / "checkpoint.json").read_text()) for d in (ray_dir, local_dir))
    assert ray_ckpt["completed"] == local_ckpt["completed"]
    assert sorted(ledger_ids(ray_dir)) == sorted(ledger_ids(local_dir))
    assert _alive_loop_hosts(cluster) == 0  # no actor outlives the run


def test_token_exact_rollouts_on_ray_keep_the_ids_a_local_run_keeps(cluster, tmp_path):
    """--tokens=exact through Ray's actors: each record carries its rollout's token data whole, the
    same ids and log-probabilities a local run of the same prompts keeps (--samples included)."""
    from hermes_batch.tokens import TokenTrace
    from tests.llamacpp_double import LlamaCppDouble
    from tests.test_tokens import echoes

    data = write_jsonl(tmp_path / "t.jsonl", [{"prompt": echoes(i % 3, answer=f"ok {i}")} for i in range(6)])
    flags = {"model": "double", "api_key": "k", "tokens": "exact", "toolsets": "terminal", "require_reasoning": False,
             "samples": 2, "timeout": 300}
    with LlamaCppDouble() as double:
        (tmp_path / "ray").mkdir()
        (tmp_path / "local").mkdir()
        ray_cli, local_cli = CLI(tmp_path / "ray", None), CLI(tmp_path / "local", None)
        on_ray = ray_cli.run("tok", data, executor="ray", ray_address=cluster.address, env=cluster.env,
                             num_workers=2, base_url=double.base_url, **flags)
        assert on_ray.returncode == 0, on_ray.stderr[-3000:]
        local = local_cli.run("tok", data, base_url=double.base_url, **flags)
        assert local.returncode == 0, local.stderr[-3000:]

    def calls(cli: CLI) -> dict[str, list]:
        return {r["id"]: r["tokens"]["calls"] for r in read_jsonl(cli.run_dir("tok") / "trajectories.jsonl")}

    on_ray_calls, local_calls = calls(ray_cli), calls(local_cli)
    assert len(on_ray_calls) == 12 and on_ray_calls == local_calls
    for rec in read_jsonl(ray_cli.run_dir("tok") / "trajectories.jsonl"):
        trace = TokenTrace.from_json(rec["tokens"])
        assert len(trace.calls) == rec["api_calls"] and trace.segments == 1


def test_the_api_key_reaches_the_actors_but_no_ray_log_or_actor_listing(cluster, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", _rows(6))
    with ScriptedModel(api_key=SECRET) as model:  # answers only with the right key: the actors had it
        res = CLI(tmp_path, model).run("key", data, executor="ray", ray_address=cluster.address, env=cluster.env, api_key=SECRET,
                                       toolsets="terminal", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    leaked = []
    for root, _, files in os.walk(cluster.temp_dir):
        for name in files:
            path = Path(root, name)
            try:
                if path.is_file() and SECRET.encode() in path.read_bytes():
                    leaked.append(str(path))
            except OSError:
                continue
    assert not leaked, f"the API key is in Ray's files: {leaked}"
    actors, jobs = _cluster_tables(cluster.address, cluster.env)
    assert any(a["ActorClassName"] == "LoopHost" for a in actors.values())
    assert any("batch_runner.py" in str(j.get("Entrypoint")) for j in jobs)  # the run's own job is listed
    assert SECRET not in json.dumps([actors, jobs], default=str)


def test_a_node_killed_mid_run_loses_nothing_and_resume_finishes(cluster, tmp_path):
    extra = cluster.add_node()  # the shared two nodes stay up for the other tests
    data = write_jsonl(tmp_path / "d.jsonl", _rows(120, tool_every=3))
    with ScriptedModel(latency=0.4) as model:
        cli = CLI(tmp_path, model)
        run = cli.popen("killed", data, executor="ray", ray_address=cluster.address, env=cluster.env, num_workers=3, concurrency=12,
                        toolsets="terminal")
        trajectories = cli.run_dir("killed")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and model.served < 40:
            time.sleep(0.1)
        assert model.served >= 40, "the run made no progress"
        cluster.kill_node(extra)
        _, err = run.communicate(timeout=300)
        assert run.returncode in (0, 3), err[-3000:]
        if run.returncode == 3:
            assert "died" in err
        resumed = cli.run("killed", data, executor="ray", ray_address=cluster.address, env=cluster.env, resume=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    ids = [r["id"] for r in read_jsonl(trajectories / "trajectories.jsonl")]
    assert len(ids) == 120 and len(set(ids)) == 120
    batch_ids = [r["id"] for p in trajectories.glob("batch_*.jsonl") for r in read_jsonl(p)]
    assert sorted(batch_ids) == sorted(ids)  # written once each, even across the crash
    failed = Counter(r["error_kind"] for r in read_jsonl(trajectories / "failed.jsonl")) \
        if (trajectories / "failed.jsonl").exists() else Counter()
    assert set(failed) <= {"worker_died"}, failed
    assert _alive_loop_hosts(cluster) == 0


def test_a_cluster_that_cannot_be_reached_is_an_error_before_any_token(tmp_path):
    _need_ray()
    data = write_jsonl(tmp_path / "d.jsonl", _rows(2))
    with ScriptedModel() as model:
        res = CLI(tmp_path, model).run("nowhere", data, executor="ray", ray_address="127.0.0.1:9", timeout=180)
        assert res.returncode == 1, res.stderr[-2000:]
        assert "cannot reach the Ray cluster at 127.0.0.1:9" in res.stderr
        assert model.served == 0 and not model.requests


def test_the_driver_killed_with_kill_9_takes_its_actors_along_and_resume_gives_each_prompt_once(cluster, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", _rows(80, tool_every=4))
    with ScriptedModel(latency=0.3) as model:
        cli = CLI(tmp_path, model)
        run = cli.popen("driver", data, executor="ray", ray_address=cluster.address, env=cluster.env, num_workers=2,
                        concurrency=8, toolsets="terminal")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and model.served < 30:
            time.sleep(0.1)
        assert model.served >= 30, "the run made no progress"
        os.kill(run.pid, 9)
        run.wait(timeout=30)
        gone = time.monotonic() + 60  # Ray ends the actors of a driver that is gone
        while time.monotonic() < gone and _alive_loop_hosts(cluster):
            time.sleep(1)
        assert _alive_loop_hosts(cluster) == 0
        resumed = cli.run("driver", data, executor="ray", ray_address=cluster.address, env=cluster.env, resume=True,
                          timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    run_dir = cli.run_dir("driver")
    ids = [r["id"] for r in read_jsonl(run_dir / "trajectories.jsonl")]
    assert len(ids) == 80 and len(set(ids)) == 80
    batch_ids = [r["id"] for p in run_dir.glob("batch_*.jsonl") for r in read_jsonl(p)]
    assert sorted(batch_ids) == sorted(ids)
    # the sandboxes the killed run's actors left were swept: each run's sandbox directory is empty
    left = [p for run in (tmp_path / "sandboxes").iterdir() for p in run.iterdir()]
    assert not left, left


def test_the_rollout_service_runs_its_rollouts_on_ray_actors_and_leaves_none(cluster, tmp_path):
    """`serve --executor=ray`: the service's warm workers are Ray actors over the cluster's nodes;
    its rollouts carry the server's tokens and the checks' rewards as on the local pool."""
    import signal

    from hermes_batch.rollout.service.rollouts import wait_for
    from hermes_batch.rollout.service.wire import RolloutRequest
    from hermes_batch.tokens import TokenTrace
    from tests.llamacpp_double import LlamaCppDouble
    from tests.test_rollout_service import IDLE, ROWS, WRITE, _free_port, _up

    write_jsonl(tmp_path / "tasks.jsonl", ROWS)
    port = _free_port()
    with LlamaCppDouble() as double:
        args = [sys.executable, str(Path(__file__).resolve().parent.parent / "batch_runner.py"), "serve",
                f"--dataset_file={tmp_path / 'tasks.jsonl'}", "--run_name=online", f"--output_dir={tmp_path / 'data'}",
                "--model=double", f"--base_url={double.base_url}", "--api_key=k", "--toolsets=terminal",
                "--executor=ray", f"--ray_address={cluster.address}", "--num_workers=2", "--concurrency=4",
                f"--sandbox_root={tmp_path / 'sandboxes'}", f"--port={port}"]
        with open(tmp_path / "serve.log", "w") as log:
            proc = subprocess.Popen(args, cwd=tmp_path, env=cluster.env, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=log)
        try:
            client = _up(f"http://127.0.0.1:{port}", proc, tmp_path / "data" / "online", seconds=180)
            asked = [RolloutRequest(rollout_id=f"r{i}", task=WRITE if i % 2 else IDLE, policy_version=1) for i in range(6)]
            for req in asked:
                client.submit(req)
            results = {r.rollout_id: wait_for(client, r.rollout_id, timeout=240) for r in asked}
            client.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
    log_text = (tmp_path / "serve.log").read_text()
    assert code == 0, log_text[-3000:]
    assert "Ray: 2 actors on" in log_text, log_text[-3000:]
    records = {r["id"]: r for r in read_jsonl(tmp_path / "data" / "online" / "trajectories.jsonl")}
    for rid, result in results.items():
        assert result.state == "done" and result.policy_version == 1, result
        assert result.reward == (1.0 if int(rid[1:]) % 2 else 0.0)  # the write task passes its check, the idle one fails
        [segment] = TokenTrace.read(records[rid]["tokens"]).rows()
        assert result.turns[-1].prompt_ids + result.turns[-1].completion_ids == segment["input_ids"]
    assert _alive_loop_hosts(cluster) == 0  # no actor outlives the service
