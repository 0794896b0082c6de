"""Crash safety as a tested property: kill -9, torn lines and Ctrl-C lose nothing and duplicate nothing."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

from hermes_batch.dataset.rows import load_dataset
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel


def ids_in(path: Path) -> Counter:
    return Counter(json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip())


def batch_ids(run: Path) -> Counter:
    total = Counter()
    for p in run.glob("batch_*.jsonl"):
        for line in p.read_text().splitlines():
            try:
                total[json.loads(line)["id"]] += 1
            except ValueError:
                pass  # a torn last line is allowed until the next start repairs it
    return total


def wait_for_records(run: Path, n: int, proc, timeout: float = 60) -> None:
    """Until the run has written `n` trajectories, the process ended, or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while sum(batch_ids(run).values()) < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def _processes():
    """(pid, parent pid, cmdline bytes, cwd or None) of every process we may read."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            cwd = None
        yield int(entry), ppid, cmd, cwd


def processes_in(directory: Path) -> list[int]:
    """Pids of processes whose working directory is `directory`: the runner and its workers."""
    return [pid for pid, _, _, cwd in _processes() if cwd == str(directory)]


def kill_9_at(cli: CLI, name: str, data: Path, points: list[int], **flags) -> None:
    """Run, and kill -9 the run once it has written `points[i]` trajectories (just after start-up
    for 0), resuming after the first: each time, nothing is written twice."""
    for attempt, point in enumerate(points):
        proc = cli.popen(name, data, resume=attempt > 0, **flags)
        wait_for_records(cli.run_dir(name), point, proc, timeout=300)
        if point == 0:
            time.sleep(random.Random(7).uniform(0.2, 1.0))
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be killed: {proc.stderr.read()}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert max(batch_ids(cli.run_dir(name)).values(), default=1) == 1, "a trajectory was written twice"


def test_kill_9_again_and_again_then_resume_gives_every_prompt_exactly_once(tmp_path):
    model = ScriptedModel(latency=0.1, record_requests=False)
    model.start()
    try:
        cli = CLI(tmp_path, model)
        rows = [{"prompt": f"crash test prompt {i}"} for i in range(120)] + [{"prompt": "crash test prompt 7"}]
        data = write_jsonl(tmp_path / "d.jsonl", rows)
        expected = {r.id for r in load_dataset(data).records}
        assert len(expected) == 121  # the duplicate row is its own prompt
        # kill at chosen points of progress (not at chosen times, which a fast machine would outrun),
        # once right at start-up, and then resume each time
        kill_9_at(cli, "crash", data, [0, 12, 40, 41, 75, 100], num_workers=2, concurrency=4, batch_size=7)
        deadline = time.monotonic() + 10
        while processes_in(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_in(tmp_path), "workers outlived their killed parent"
        res = cli.run("crash", data, resume=True, num_workers=2, concurrency=8, batch_size=7)
        assert res.returncode == 0, res.stderr
    finally:
        model.stop()
    run = cli.run_dir("crash")
    final = ids_in(run / "trajectories.jsonl")
    assert set(final) == expected and set(final.values()) == {1}
    assert set(batch_ids(run).values()) == {1}
    assert not list((tmp_path / "sandboxes").glob("*/*")), "sandboxes of killed runs were not swept"


def test_a_torn_last_line_is_repaired_and_its_prompt_run_again(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    assert cli.run("torn", data, batch_size=100).returncode == 0
    batch = cli.run_dir("torn") / "batch_0.jsonl"
    lines = batch.read_bytes().splitlines(keepends=True)
    victim = json.loads(lines[-1])["id"]
    batch.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # kill -9 mid-write
    res = cli.run("torn", data, resume=True, batch_size=100)
    assert res.returncode == 0, res.stderr
    assert "repaired batch_0.jsonl: dropped" in res.stderr and "4 already done" in res.stderr
    final = ids_in(cli.run_dir("torn") / "trajectories.jsonl")
    assert len(final) == 5 and set(final.values()) == {1} and victim in final
    assert all(line.strip() for line in batch.read_text().splitlines())
    assert len(read_jsonl(batch)) == 5  # every line parses again


def test_ctrl_c_stops_cleanly_and_resume_finishes(tmp_path):
    model = ScriptedModel(latency=0.3, record_requests=False)
    model.start()
    try:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"interrupt me {i}"} for i in range(60)])
        proc = cli.popen("ctrlc", data, num_workers=2, concurrency=4)
        wait_for_records(cli.run_dir("ctrlc"), 5, proc)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the whole process group
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "not finished will run with --resume" in err
        run = cli.run_dir("ctrlc")
        partial = ids_in(run / "trajectories.jsonl")
        assert 0 < len(partial) < 60
        assert not list((tmp_path / "sandboxes").glob("*/*")), "an interrupted run left sandboxes behind"
        res = cli.run("ctrlc", data, resume=True, num_workers=2, concurrency=8)
        assert res.returncode == 0, res.stderr
    finally:
        model.stop()
    final = ids_in(run / "trajectories.jsonl")
    assert len(final) == 60 and set(final.values()) == {1}


def worker_pids(runner: int) -> list[int]:
    """The run's worker processes: forked from its fork server (or spawned by the run itself)."""
    procs = list(_processes())
    servers = {pid for pid, ppid, cmd, _ in procs if ppid == runner and b"multiprocessing.forkserver" in cmd}
    return [pid for pid, ppid, cmd, _ in procs
            if ppid in servers or (ppid == runner and b"spawn_main" in cmd and b"resource_tracker" not in cmd)]


def test_a_worker_killed_mid_run_loses_nothing(tmp_path):
    model = ScriptedModel(latency=0.2, record_requests=False)
    model.start()
    try:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"worker death {i}"} for i in range(40)])
        proc = cli.popen("wdeath", data, num_workers=2, concurrency=6)
        wait_for_records(cli.run_dir("wdeath"), 5, proc, timeout=30)
        victims = worker_pids(proc.pid)
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, err  # the run went on; the lost prompts are owed
        failed = read_jsonl(cli.run_dir("wdeath") / "failed.jsonl")
        assert failed and {f["error_kind"] for f in failed} == {"worker_died"}
        res = cli.run("wdeath", data, resume=True)
        assert res.returncode == 0, res.stderr
    finally:
        model.stop()
    final = ids_in(cli.run_dir("wdeath") / "trajectories.jsonl")
    assert len(final) == 40 and set(final.values()) == {1}


def test_ctrl_c_while_the_run_waits_for_a_worker_to_stop_exits_130(tmp_path):
    """A Ctrl-C is an interrupt whatever the code it lands in makes of it. Here it lands while the
    run, its prompts settled, waits for a stuck worker to stop: the pool's stop takes it for "stop
    waiting", as it would a second one, and the run used to end 0 as if nobody had pressed it. (A
    Ctrl-C in the pre-flight's asyncio.run was taken for a cancellation that a helper process killed
    by the same Ctrl-C could overtake with an error of its own: exit 1, once in CI.)"""
    model = ScriptedModel(record_requests=True)
    model.start()
    idle = None
    try:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
        proc = cli.popen("stuck", data, num_workers=2, concurrency=4)
        deadline = time.monotonic() + 60
        while not model.requests and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        busy, idle = sorted(worker_pids(proc.pid))  # the pool hands both prompts to its first worker
        os.kill(idle, signal.SIGSTOP)  # stuck: the run's stop waits for it (up to its 30 s grace)
        deadline = time.monotonic() + 60
        while _running(busy) and time.monotonic() < deadline:  # it exits once the run stops its workers
            time.sleep(0.02)
        assert not _running(busy) and proc.poll() is None, "the run did not get to stopping its workers"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "stopped: interrupted" in err
    finally:
        model.stop()
        if idle is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(idle, signal.SIGKILL)
    assert len(ids_in(cli.run_dir("stuck") / "trajectories.jsonl")) == 2  # what was done is kept


def _running(pid: int) -> bool:
    """Alive and not a zombie its parent has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_workers_of_a_killed_run_exit_even_with_results_nobody_reads(tmp_path):
    """Prompts that finish after the run is killed leave results in a pipe nobody reads any more;
    a worker used to wait at exit to flush them into it, for ever (found leaked by the soak)."""
    from tests.scripted_model import script

    model = ScriptedModel(latency=0.0, record_requests=False)
    model.start()
    try:
        cli = CLI(tmp_path, model)
        rows = [{"prompt": script({"answer": "x" * 4000}, text=f"fast {i}")} for i in range(3000)]
        data = write_jsonl(tmp_path / "d.jsonl", rows)
        proc = cli.popen("pipe", data, num_workers=2, concurrency=128, toolsets="terminal")
        wait_for_records(cli.run_dir("pipe"), 200, proc, timeout=120)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while processes_in(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_in(tmp_path), "workers outlived their killed run"
    finally:
        model.stop()


def test_a_full_disk_stops_the_run_gracefully_and_resume_finishes_it(cli, tmp_path):
    """A full disk ended in three chained tracebacks and left a .checkpoint.json.tmp-<pid> behind
    (no data was lost: that holds)."""
    import subprocess

    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounts a small filesystem for the run's files (root)")
    out = tmp_path / "small"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(out)], check=True)
    try:
        rows = [{"prompt": f"fill the disk {i} " + "x" * 2000} for i in range(120)]
        data = write_jsonl(tmp_path / "d.jsonl", rows)
        res = cli.run("full", data, output_dir=str(out), require_reasoning=False)
        assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr[-3000:]
        assert "is full: free space and rerun with --resume" in res.stderr
        assert not list(out.rglob(".*.tmp-*"))  # no temporary file left beside the checkpoint
        subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)
        res = cli.run("full", data, output_dir=str(out), resume=True, require_reasoning=False)
        assert res.returncode == 0, res.stderr[-3000:]
        records = read_jsonl(out / "full" / "trajectories.jsonl")
        assert sorted(r["prompt_index"] for r in records) == list(range(120))  # every prompt, once
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


def test_a_killed_run_leaves_no_mounted_filesystem_or_loop_device_behind(tmp_path):
    """As root, each prompt's files are a filesystem on a loop device: a run killed with kill -9
    left them mounted (and the devices held, and their images on disk) until a resume of the same
    run swept them, which might never come."""
    import subprocess

    import pytest

    from hermes_batch.backends.disk import mounts_under

    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.skip("a filesystem per prompt needs root and loop devices")
    script = '{"calls": [["terminal", {"command": "echo started; sleep 30"}]]}'
    root = tmp_path / "sandboxes"

    def devices() -> list[str]:  # loop devices (global) backed by this run's images
        out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if str(root) in line]

    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"kill me {i}\nSCRIPT: [{script}]"} for i in range(6)])
        proc = cli.popen("killed", data, num_workers=2, concurrency=6, command_timeout=60)
        deadline = time.monotonic() + 60
        while len(devices()) < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(devices()) == 6, "the prompts' sandboxes did not start"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while (devices() or mounts_under(root) or list(root.rglob("*.disk"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert devices() == [] and mounts_under(root) == [] and list(root.rglob("*.disk")) == []


def test_kill_9_between_the_agents_end_and_its_check_runs_the_prompt_again_once(tmp_path):
    """The record is written only after the check: killed while the check runs, nothing of that
    prompt is kept, and the resume runs it once, check and all."""
    from tests.scripted_model import script

    model = ScriptedModel()
    model.start()
    try:
        cli = CLI(tmp_path, model)
        marker = "7.3217"  # the check's sleep, to find it among the machine's processes
        rows = [{"prompt": script({"calls": [["terminal", {"command": "echo 42 > out.txt"}]]}, {"answer": "42"}),
                 "check": f"sleep {marker}; grep -q 42 out.txt", "expected": 42},
                {"prompt": "an unchecked prompt"}]
        data = write_jsonl(tmp_path / "d.jsonl", rows)
        proc = cli.popen("kcheck", data, require_reasoning=False, num_workers=1)
        deadline = time.monotonic() + 60
        while not any(b"sleep\0" + marker.encode() in cmd for _, _, cmd, _ in _processes()):
            assert proc.poll() is None and time.monotonic() < deadline, "the check never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        run = cli.run_dir("kcheck")
        checked = load_dataset(data).ids[0]
        assert checked not in batch_ids(run), "a record was written before its check ended"
        res = cli.run("kcheck", data, resume=True, require_reasoning=False)
        assert res.returncode == 0, res.stderr
    finally:
        model.stop()
    final = read_jsonl(run / "trajectories.jsonl")
    assert Counter(r["id"] for r in final) == Counter(load_dataset(data).ids)  # each once
    assert next(r for r in final if r["id"] == checked)["verification"]["status"] == "pass"
