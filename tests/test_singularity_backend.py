"""The Singularity/Apptainer backend against a real Apptainer (scripts/setup_apptainer.sh)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.backend_harness import TEST_SIF, apptainer_status, unavailable
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script


@pytest.fixture(autouse=True)
def _need_apptainer():
    why = apptainer_status()
    if why:
        unavailable("singularity", why)


def instances() -> list[str]:
    exe = os.environ.get("HERMES_BATCH_APPTAINER") or shutil.which("apptainer") or shutil.which("singularity")
    out = subprocess.run([exe, "instance", "list", "--json"], capture_output=True, text=True, timeout=60).stdout
    return [i["instance"] for i in json.loads(out or "{}").get("instances", [])]


def flags(**more):
    return {"backend": "singularity", "image": TEST_SIF, "sandbox_root": "/tmp/hermes-batch-test-sandboxes", **more}


def test_a_singularity_run_gives_the_same_kind_of_trajectories(cli, tmp_path):
    before = set(instances())
    rows = [
        {"prompt": script({"calls": [["terminal", {"command": "pwd; cat /proc/net/dev | tail -n +3 | cut -d: -f1"}]]},
                          {"answer": "{last_tool}"}, text="where")},
        {"prompt": script({"calls": [["terminal", {"command": "pwd; ls /etc/os-release"}]]}, {"answer": "{last_tool}"}, text="cwd"),
         "cwd": "/srv/app"},
        {"prompt": script({"calls": [["session", {"codes": ["print(1)", "import sys; sys.exit(2)"]}]]}, {"answer": "k"})},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    res = cli.run("sing", data, **flags())
    assert res.returncode == 0, res.stderr
    records = read_jsonl(cli.run_dir("sing") / "trajectories.jsonl")
    outs = [json.loads(r["conversations"][3]["value"].split("\n")[1])["content"] for r in records]
    assert outs[0]["output"].split() == ["/workspace", "lo"]  # no network by default
    assert outs[1]["output"].startswith("/srv/app\n")
    assert [o["exit_code"] for o in outs[2]] == [0, 2]
    assert {r["metadata"]["backend"] for r in records} == {"singularity"}
    assert set(instances()) == before  # every instance stopped


def test_an_image_that_cannot_be_had_fails_its_prompt_at_once(cli, tmp_path):
    rows = [{"prompt": "fine"}, {"prompt": "missing sif", "image": "/var/tmp/no-such-image.sif"},
            {"prompt": "needs a registry", "image": "hermes-batch-no-such:1"}]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    started = time.monotonic()
    res = cli.run("singimg", data, **flags())
    assert res.returncode == 3, res.stderr
    failed = {f["prompt_index"]: f for f in read_jsonl(cli.run_dir("singimg") / "failed.jsonl")}
    assert set(failed) == {1, 2} and {f["error_kind"] for f in failed.values()} == {"image_unavailable"}
    assert "does not exist" in failed[1]["error"] and "could not be built" in failed[2]["error"]
    assert not any("missing sif" in json.dumps(r["messages"]) for r in cli.model.requests)
    assert time.monotonic() - started < 120


def test_instances_of_a_killed_run_are_stopped_at_the_next_start(tmp_path):
    model = ScriptedModel(latency=0.3)
    model.start()
    cli = CLI(tmp_path, model)
    rows = [{"prompt": script({"calls": [["terminal", {"command": "sleep 3"}]]}, {"answer": "k"}, text=f"p{i}")}
            for i in range(6)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    before = set(instances())
    try:
        proc = cli.popen("singkill", data, num_workers=2, concurrency=4, **flags())
        deadline = time.monotonic() + 90
        while len(set(instances()) - before) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        left = set(instances()) - before
        assert len(left) >= 3
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert set(instances()) - before  # left behind...
        res = cli.run("singkill", data, resume=True, num_workers=2, concurrency=4)
        assert res.returncode == 0, res.stderr
        assert "left behind by an earlier run" in res.stderr
    finally:
        model.stop()
    assert set(instances()) == before  # ...and stopped
    assert len(read_jsonl(cli.run_dir("singkill") / "trajectories.jsonl")) == 6


def test_nothing_of_the_agents_runs_beside_the_check_not_even_the_instances_init(tmp_path):
    """The instance's init (PID 1) is spared by the end of the agent's processes, yet the commands
    can write its memory (a loop planted there would forge the check's result): it is stopped from
    the host before the rest are ended, and the sandbox still runs the check."""
    import asyncio

    from hermes_batch.backends import SandboxSpec
    from tests.backend_harness import make_backend_under_test

    but = make_backend_under_test("singularity", tmp_path)
    threat = "python3 -c \"open('/proc/1/mem', 'r+b'); print('writable')\"; (sleep 300 >/dev/null 2>&1 &) ; nohup sleep 301 >/dev/null 2>&1 &"
    probe = ("import os\nmine, p = set(), os.getpid()\n"
             "while p > 0:\n    mine.add(p)\n    p = int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])\n"
             "for d in sorted(os.listdir('/proc')):\n    if d.isdigit() and int(d) not in mine:\n"
             "        print(d, open(f'/proc/{d}/stat').read().rsplit(')', 1)[1].split()[0])\n")

    async def main():
        backend = but.make()
        await backend.setup()
        sb = await backend.start(SandboxSpec(prompt_id="init", image=but.image))
        try:
            planted = await sb.exec(threat, timeout=30)
            await sb.end_processes()
            seen = await sb.exec(probe, language="python", timeout=30)
        finally:
            await sb.close()
            await backend.shutdown()
        return planted, seen

    try:
        planted, seen = asyncio.run(main())
    finally:
        but.cleanup()
    assert planted.stdout.startswith("writable"), planted  # the threat is real: PID 1 is the commands' user's
    states = dict(line.split() for line in seen.stdout.splitlines())
    assert states.get("1") == "T" and all(s in ("T", "Z") for s in states.values()), seen.stdout + seen.stderr
