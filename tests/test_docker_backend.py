"""The Docker backend against a real Docker engine: images, hardening, labels, cleanup, limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time

import pytest

from hermes_batch.backends import BackendSettings, ImageUnavailable, SandboxSpec, load_backend
from hermes_batch.config import run_label
from hermes_batch.store import RunLocation
from tests.backend_harness import TEST_IMAGE, docker_status, unavailable
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script


@pytest.fixture(autouse=True)
def _need_docker():
    why = docker_status()
    if why:
        unavailable("docker", why)


@pytest.fixture
def engine():
    import docker

    client = docker.from_env()
    yield client
    client.close()


def containers_of(engine, label: str) -> list:
    return engine.api.containers(all=True, filters={"label": f"hermes-batch.run={label}"})


def run_containers(engine, cli: CLI, run_name: str) -> list[dict]:
    """Containers of this test's run (its label: the run name and a hash of its directory; other
    tests' runs of the same name may have containers up at the same time)."""
    return containers_of(engine, run_label(RunLocation(run_name=run_name, output_dir=str(cli.out))))


def run_label_of(cli: CLI, run_name: str) -> str:
    return json.loads((cli.run_dir(run_name) / "trajectories.jsonl").read_text().splitlines()[0])["metadata"]["run_name"]


def docker_flags(**more):
    return {"backend": "docker", "image": TEST_IMAGE, **more}


@contextlib.contextmanager
def built_image(engine, context, name: str, dockerfile: str):
    """An image of this test's own, built from the test image without a registry, removed after."""
    (context / "Dockerfile").write_text(f"FROM {TEST_IMAGE}\n{dockerfile}")
    tag = f"hermes-batch-test:{name}-{os.getpid()}"  # two runs on one engine keep apart
    engine.images.build(path=str(context), tag=tag, pull=False, rm=True)
    try:
        yield tag
    finally:
        engine.images.remove(tag, force=True)


def on_docker(image: str, body):
    """`body(backend)` on a docker backend of its own, set up and shut down around it."""
    async def main():
        backend = load_backend("docker", BackendSettings(run_label=f"{image.split(':')[-1]}-{os.getpid()}", image=image))
        await backend.setup()
        try:
            return await body(backend)
        finally:
            await backend.shutdown()

    return asyncio.run(main())


def test_a_docker_run_gives_the_same_kind_of_trajectories_as_local(cli, tmp_path, engine):
    rows = [
        {"prompt": script({"calls": [["terminal", {"command": "pwd; python3 -c 'import sys; print(sys.version_info[0])'"}]]},
                          {"answer": "{last_tool}"}, text="where am I")},
        {"prompt": script({"calls": [["terminal", {"command": "pwd && ls -a"}]]}, {"answer": "{last_tool}"}, text="cwd row"),
         "cwd": "/srv/project", "image": TEST_IMAGE},
        {"prompt": script({"calls": [["write_file", {"path": "a.py", "content": "print(6*7)"}],
                                     ["sandbox", {"code": "exec(open('a.py').read())"}]]}, {"answer": "{last_tool}"})},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    res = cli.run("dock", data, **docker_flags())
    assert res.returncode == 0, res.stderr
    records = read_jsonl(cli.run_dir("dock") / "trajectories.jsonl")
    assert len(records) == 3 and all(r["completed"] for r in records)
    tool_out = [json.loads(r["conversations"][3]["value"].split("\n")[1])["content"] for r in records]
    assert tool_out[0]["output"] == "/workspace\n3"
    assert tool_out[1]["output"].startswith("/srv/project\n")
    assert tool_out[2]["bytes_written"] == 10 and tool_out[2]["resolved_path"] == "/workspace/a.py"
    # what the program printed, as text (a text result is never re-read as JSON in the record)
    assert json.loads(records[2]["conversations"][3]["value"].split("\n")[4])["content"] == "42\n"
    assert {r["metadata"]["backend"] for r in records} == {"docker"}
    assert {r["metadata"]["image"] for r in records} == {TEST_IMAGE}
    assert all(r["metadata"]["timings"]["sandbox_start_seconds"] > 0 for r in records)
    assert containers_of(engine, run_label_of(cli, "dock")) == []  # every container removed


def test_a_missing_image_fails_at_once_without_spending_tokens_and_is_retried(cli, tmp_path, engine):
    rows = [{"prompt": "fine one"}, {"prompt": "needs a missing image", "image": "hermes-batch-no-such-image:1"},
            {"prompt": "fine two"}]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    res = cli.run("noimg", data, **docker_flags())
    assert res.returncode == 3, res.stderr
    assert "hermes-batch-no-such-image:1" in res.stderr and "could not be pulled" in res.stderr
    [failure] = read_jsonl(cli.run_dir("noimg") / "failed.jsonl")
    assert failure["prompt_index"] == 1 and failure["error_kind"] == "image_unavailable"
    assert not any("missing image" in json.dumps(r["messages"]) for r in cli.model.requests)  # no tokens spent
    assert len(read_jsonl(cli.run_dir("noimg") / "trajectories.jsonl")) == 2
    engine.images.get(TEST_IMAGE).tag("hermes-batch-no-such-image", "1")  # the image appears...
    try:
        res = cli.run("noimg", data, resume=True)
        assert res.returncode == 0, res.stderr  # ...and the resume retries the prompt
    finally:
        engine.images.remove("hermes-batch-no-such-image:1")
    assert len(read_jsonl(cli.run_dir("noimg") / "trajectories.jsonl")) == 3


def test_each_image_is_checked_once_however_many_prompts_need_it(tmp_path):
    backend = load_backend("docker", BackendSettings(run_label="imgcheck", image=TEST_IMAGE))
    calls = []
    original = backend._ensure_image

    def counting(image):
        calls.append(image)
        time.sleep(0.2)
        return original(image)

    backend._ensure_image = counting

    async def main():
        await backend.setup()
        try:
            ok = await asyncio.gather(*(backend.prepare_image(TEST_IMAGE) for _ in range(20)))
            bad = await asyncio.gather(*(backend.prepare_image("hermes-batch-absent:9") for _ in range(20)),
                                       return_exceptions=True)
        finally:
            await backend.shutdown()
        return ok, bad

    ok, bad = asyncio.run(main())
    assert ok == [TEST_IMAGE] * 20
    assert all(isinstance(b, ImageUnavailable) for b in bad)
    assert sorted(calls) == ["hermes-batch-absent:9", TEST_IMAGE]


def test_containers_are_hardened_and_limited(tmp_path, engine):
    settings = BackendSettings(run_label="harden", image=TEST_IMAGE, memory="300m", cpus=0.5, pids_limit=64)

    async def main():
        backend = load_backend("docker", settings)
        await backend.setup()
        sb = await backend.start(SandboxSpec(prompt_id="p1", labels={"extra": "yes"}))
        try:
            info = engine.api.inspect_container(sb.id)
            checks = await sb.exec(
                "grep CapEff /proc/self/status; touch /etc/x 2>&1; cat /sys/fs/cgroup/pids/pids.max "
                "/sys/fs/cgroup/memory/memory.limit_in_bytes; cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
                "grep NoNewPrivs /proc/self/status", language="shell", timeout=30)
            net = await sb.exec("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
                                "    print('connected')\nexcept OSError as e:\n    print('no network:', e)",
                                language="python", timeout=30)
        finally:
            await sb.close()
            await backend.shutdown()
        return info, checks, net

    info, checks, net = asyncio.run(main())
    host = info["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["ReadonlyRootfs"] and host["NetworkMode"] == "none"
    assert host["PidsLimit"] == 64 and host["Memory"] == 300 * 2**20 and host["NanoCpus"] == 5 * 10**8
    labels = info["Config"]["Labels"]
    assert labels["hermes-batch"] == "1" and labels["hermes-batch.run"] == "harden"
    assert labels["hermes-batch.prompt-id"] == "p1" and labels["extra"] == "yes"
    out = checks.stdout.split()
    assert "CapEff:\t0000000000000000" in checks.stdout
    assert "Read-only file system" in checks.stdout
    assert "64" in out and str(300 * 2**20) in out
    assert [i.strip() for i in checks.stdout.splitlines() if i.strip() in ("lo", "eth0")] == ["lo"]
    assert "NoNewPrivs:\t1" in checks.stdout
    assert net.stdout.startswith("no network")


def test_the_prompts_commands_cannot_reach_the_processes_that_outlive_their_end(tmp_path, engine):
    """A review wrote, through /proc/<pid>/mem, a shell loop into the container's `sleep infinity`,
    which the end of the agent's processes spared: the loop forged the check's result. The init and
    its keeper now run as a user of their own: no signal, no memory write reaches them."""
    settings = BackendSettings(run_label="keeper", image=TEST_IMAGE)
    probe = ("import os, signal\n"
             "for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
             "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0].decode()\n"
             "    for what, act in (('mem', lambda: open(f'/proc/{pid}/mem', 'r+b')), ('kill', lambda: os.kill(int(pid), signal.SIGSTOP))):\n"
             "        try:\n            act()\n            print(pid, cmd, what, 'ALLOWED')\n"
             "        except OSError as e:\n            print(pid, cmd, what, 'denied', e.errno)\n")

    async def main():
        backend = load_backend("docker", settings)
        await backend.setup()
        sb = await backend.start(SandboxSpec(prompt_id="keeper"))
        try:
            seen = await sb.exec(probe, language="python", timeout=30)
            await sb.end_processes()
            after = await sb.exec("echo still-up", timeout=30)
        finally:
            await sb.close()
            await backend.shutdown()
        return seen, after

    seen, after = asyncio.run(main())
    lines = [line for line in seen.stdout.splitlines() if "docker-init" in line or "sleep" in line]
    assert len(lines) == 4 and all("denied" in line for line in lines), seen.stdout + seen.stderr
    assert after.stdout == "still-up\n"  # the keeper outlived the end of the commands' processes


def test_with_network_a_container_keeps_a_network_of_its_own_whose_way_out_is_the_guard(tmp_path, engine):
    """--network no longer puts containers on the default bridge (where they reached each other and
    this machine): each has a network of its own, and the guard listens on its loopback."""
    from hermes_batch.tools.guard_proxy import GuardProxy

    async def main():
        backend = load_backend("docker", BackendSettings(run_label="net", image=TEST_IMAGE, network=True))
        backend.egress = guard = GuardProxy()
        await backend.setup()
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            mode = engine.api.inspect_container(sb.id)["HostConfig"]["NetworkMode"]
            asked = await sb.exec("python3 -c \"import urllib.request as u; print(u.urlopen('http://10.1.2.3/').read())\"",
                                  timeout=30)
            return mode, asked, guard.refused
        finally:
            await sb.close()
            await backend.shutdown()
            await guard.close()

    mode, asked, refused = asyncio.run(main())
    assert mode == "none"
    assert "HTTP Error 403" in asked.stderr and refused == 1, asked  # through the proxy variables, to the guard


def test_an_unknown_runtime_fails_the_prompt_clearly(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x"}])
    res = cli.run("rt", data, **docker_flags(runtime="no-such-runtime"))
    assert res.returncode == 3
    [failure] = read_jsonl(cli.run_dir("rt") / "failed.jsonl")
    assert failure["error_kind"] == "sandbox_error" and "no-such-runtime" in failure["error"]


def test_live_containers_stay_within_max_sandboxes(tmp_path, engine):
    model = ScriptedModel(latency=0.2)
    model.start()
    cli = CLI(tmp_path, model)
    rows = [{"prompt": script({"calls": [["terminal", {"command": "sleep 0.3"}]]}, {"answer": "k"}, text=f"p{i}")}
            for i in range(16)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    seen, stop = [], threading.Event()

    def watch():
        while not stop.wait(0.05):
            seen.append(len(run_containers(engine, cli, "limit")))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        res = cli.run("limit", data, num_workers=2, concurrency=8, max_sandboxes=3, **docker_flags())
    finally:
        stop.set()
        watcher.join()
        model.stop()
    assert res.returncode == 0, res.stderr
    assert max(seen) == 3  # reached, never exceeded
    assert model.max_in_flight > 3  # model requests were not held to the sandbox limit


def test_containers_of_a_killed_run_are_swept_at_the_next_start(tmp_path, engine):
    model = ScriptedModel(latency=0.3)
    model.start()
    cli = CLI(tmp_path, model)
    rows = [{"prompt": script({"calls": [["terminal", {"command": "sleep 2"}]]}, {"answer": "k"}, text=f"p{i}")}
            for i in range(12)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    try:
        proc = cli.popen("killed", data, num_workers=2, concurrency=6, **docker_flags())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            mine = run_containers(engine, cli, "killed")
            if len(mine) >= 4:
                break
            time.sleep(0.1)
        assert len(mine) >= 4, "the run never got its containers up"
        label = mine[0]["Labels"]["hermes-batch.run"]
        os.killpg(proc.pid, signal.SIGKILL)  # parent and workers at once: nobody cleans up
        proc.wait()
        assert len(containers_of(engine, label)) >= 4  # left behind...
        res = cli.run("killed", data, resume=True, num_workers=2, concurrency=6)
        assert res.returncode == 0, res.stderr
        assert "left behind by an earlier run" in res.stderr  # ...and swept at the next start
        assert containers_of(engine, label) == []
    finally:
        model.stop()
    assert len(read_jsonl(cli.run_dir("killed") / "trajectories.jsonl")) == 12


def test_ctrl_c_leaves_no_containers(tmp_path, engine):
    model = ScriptedModel(latency=0.3)
    model.start()
    cli = CLI(tmp_path, model)
    rows = [{"prompt": script({"calls": [["terminal", {"command": "sleep 30"}]]}, {"answer": "k"}, text=f"p{i}")}
            for i in range(8)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    try:
        proc = cli.popen("ctrlc", data, num_workers=2, concurrency=4, **docker_flags())
        deadline = time.monotonic() + 60
        mine = []
        while time.monotonic() < deadline and len(mine) < 4:
            mine = run_containers(engine, cli, "ctrlc")
            time.sleep(0.1)
        assert len(mine) == 4
        label = mine[0]["Labels"]["hermes-batch.run"]
        time.sleep(1)  # the commands are running now
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        model.stop()
    assert proc.returncode == 130, err
    assert containers_of(engine, label) == []


def test_gvisor_runtime_runs_the_prompt_in_gvisor(cli, tmp_path):
    from tests.backend_harness import GVISOR_RUNTIME, gvisor_status

    why = gvisor_status()
    if why:
        unavailable("docker-gvisor", why)
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"calls": [["terminal", {"command": "uname -r; dmesg 2>/dev/null | head -1"}]]}, {"answer": "k"})}])
    res = cli.run("gvisor", data, **docker_flags(runtime=GVISOR_RUNTIME))
    assert res.returncode == 0, res.stderr
    [record] = read_jsonl(cli.run_dir("gvisor") / "trajectories.jsonl")
    out = json.loads(record["conversations"][3]["value"].split("\n")[1])["content"]["output"]
    assert out.startswith("4.4.0\n")  # gVisor's own kernel version, not the host's
    assert "gVisor" in out


BUSYBOX_IMAGE = os.environ.get("HERMES_BATCH_BUSYBOX_IMAGE", "hermes-batch-busybox:test")


def test_busybox_images_work_like_any_other(tmp_path, engine):
    """Alpine-like images have BusyBox, not GNU coreutils: no bash, no `realpath -m`."""
    try:
        engine.images.get(BUSYBOX_IMAGE)
    except Exception:
        unavailable("docker", f"test image {BUSYBOX_IMAGE} is missing (scripts/build_busybox_image.sh builds it)")
    from hermes_batch.tools import TOOLS, ToolContext, call_tool

    async def main():
        backend = load_backend("docker", BackendSettings(run_label="busybox", image=BUSYBOX_IMAGE))
        await backend.setup()
        sb = await backend.start(SandboxSpec(prompt_id="bb", image=BUSYBOX_IMAGE, cwd="/app"))

        async def get():
            return sb

        ctx = ToolContext(get_sandbox=get, command_timeout=30)
        calls = [
            ("terminal", {"command": "mkdir -p sub && cd sub && echo in-sub > f.txt && pwd"}),
            ("terminal", {"command": "pwd; cat f.txt"}),
            ("write_file", {"path": "new/dir/hello.txt", "content": "hello\nworld\n"}),
            ("patch", {"path": "new/dir/hello.txt", "old_string": "world", "new_string": "busybox"}),
            ("read_file", {"path": "new/dir/hello.txt"}),
            ("search_files", {"pattern": "busy", "path": "."}),
            ("read_file", {"path": "../etc/passwd"}),
            ("terminal", {"command": "ln -s /etc /app/sneaky"}),
            ("read_file", {"path": "sneaky/passwd"}),
            ("terminal", {"command": "sleep 5", "timeout": 1}),
        ]
        try:
            return sb.workdir, [await call_tool(TOOLS[name], json.dumps(args), ctx) for name, args in calls]
        finally:
            await sb.close()
            await backend.shutdown()

    workdir, res = asyncio.run(main())
    assert workdir == "/app"
    assert json.loads(res[0].content)["output"] == "/app/sub"
    assert json.loads(res[1].content)["output"].split() == ["/app/sub", "in-sub"]
    assert all(r.ok for r in res[2:6]), [r.content for r in res[2:6]]
    assert "2|busybox" in res[4].content and json.loads(res[5].content)["matches"] == [
        {"path": "./new/dir/hello.txt", "line": 2, "content": "busybox"}]
    assert not res[6].ok and "outside the work directory" in res[6].content
    assert not res[8].ok and "leads outside" in res[8].content
    assert not res[9].ok and json.loads(res[9].content)["exit_code"] == 124


def test_a_work_tree_holding_another_user_s_files_comes_back_whole(tmp_path, engine):
    """A review: the image put a file of uid 1000 in the work directory; tar, restoring as a root
    without CAP_CHOWN, failed on it, and recheck turned a pass into an error. Big sparse files are
    kept as holes, not gigabytes of zeros."""
    from hermes_batch.store.workspace import put_back, take

    async def body(backend):
        first = await backend.start(SandboxSpec(prompt_id="a", cwd="/app"))
        try:
            await first.exec("truncate -s 3G sparse && echo mine > g", timeout=30)
            tree = await take(first, 10 * 2**20)
        finally:
            await first.close()
        second = await backend.start(SandboxSpec(prompt_id="b", cwd="/app"))
        try:
            await put_back(second, tree)
            return len(tree), await second.exec("cat f g; stat -c %s sparse; du -k sparse | cut -f1", timeout=30)
        finally:
            await second.close()

    with built_image(engine, tmp_path, "other-owner",
                     "RUN mkdir -p /app && echo theirs > /app/f && chown 1000:1000 /app/f\nWORKDIR /app\n") as tag:
        size, seen = on_docker(tag, body)
    assert seen.stdout.split() == ["theirs", "mine", str(3 * 2**30), "0"], seen
    assert size < 2**20


def test_where_the_image_s_root_keeps_its_capabilities_a_failing_entrypoint_says_so_at_once(tmp_path, engine):
    """As Harbor runs a task's image: its ENTRYPOINT as its own root, apart from the container's keeper;
    one that fails at its start fails the sandbox's start with what it printed."""
    with built_image(engine, tmp_path, "failing-root-entrypoint",
                     'ENTRYPOINT ["/bin/sh", "-c", "echo as $(id -u): no config >&2; exit 3", "--"]\n') as tag:
        async def body(backend):
            with pytest.raises(Exception) as failed:
                await backend.start(SandboxSpec(prompt_id="p", image=tag, image_root=True))
            return str(failed.value)

        said = on_docker(tag, body)
        assert not containers_of(engine, f"{tag.split(':')[-1]}-{os.getpid()}")  # (on_docker's run label)
    assert "ENTRYPOINT /bin/sh -c" in said and "(exit code 3)" in said and "as 0: no config" in said, said


def test_a_container_whose_entrypoint_fails_says_so_at_once_with_what_it_said(cli, tmp_path, engine):
    """A review ran Harbor images whose ENTRYPOINT writes /etc/hosts as root: the container exited,
    and the prompt failed later blaming a missing shell that was there."""
    with built_image(engine, tmp_path, "failing-entrypoint",
                     'ENTRYPOINT ["/bin/sh", "-c", "echo cannot write /etc/hosts >&2; exit 3", "--"]\n') as tag:
        rows = [{"prompt": script({"calls": [["terminal", {"command": "echo hi"}]]}, {"answer": "x"}), "image": tag}]
        res = cli.run("entry", write_jsonl(tmp_path / "d.jsonl", rows), backend="docker", require_reasoning=False)
    [failed] = read_jsonl(cli.run_dir("entry") / "failed.jsonl")
    assert "the container ended at its start (exit code 3)" in failed["error"], failed["error"]
    assert "cannot write /etc/hosts" in failed["error"] and "ENTRYPOINT /bin/sh -c" in failed["error"]
    assert "POSIX shell" not in failed["error"] and res.returncode == 3


def test_the_agent_s_commands_keep_the_image_s_own_home_and_pythonpath(tmp_path, engine):
    """A review: HOME and PYTHONPATH were replaced in every command, so an image's ENV PYTHONPATH
    (and the packages it points at) was lost to the agent."""
    async def body(backend):
        box = await backend.start(SandboxSpec(prompt_id="e"))
        try:
            return await box.exec('echo "$HOME $PYTHONPATH"; python3 -c "import libmod; print(libmod.X)"', timeout=30)
        finally:
            await box.close()

    with built_image(engine, tmp_path, "own-env", "ENV HOME=/srv/home PYTHONPATH=/opt/lib\n"
                     "RUN mkdir -p /opt/lib /srv/home && echo 'X = 7' > /opt/lib/libmod.py\n") as tag:
        seen = on_docker(tag, body)
    assert seen.stdout.split() == ["/srv/home", "/tmp/site-packages:/opt/lib", "7"], seen


class LateReadingEngine:
    """The real engine behind a unix socket that hands on what the engine says 0.5 s late, all at
    once: as a client slow to read on a loaded machine finds it, an exec's upgrade headers and the
    output of a quick command in one read."""

    def __init__(self, path: str):
        import socket

        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect("/var/run/docker.sock")
            threading.Thread(target=self._pump, args=(client, engine, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(engine, client, 0.5), daemon=True).start()

    @staticmethod
    def _pump(src, dst, late: float) -> None:
        import socket

        try:
            while data := src.recv(65536):
                time.sleep(late)
                src.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    while more := src.recv(65536):
                        data += more
                src.setblocking(True)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()


def test_a_quick_command_s_output_read_late_is_not_lost(tmp_path, monkeypatch):
    """CI failed so, under gVisor and Docker alike on a loaded machine: the Docker SDK reads an exec's
    upgrade headers through a buffer, then hands out the socket beneath it; the output that came in
    the same read stayed in the buffer. A check's output and a file the runner read came back empty."""
    if not os.path.exists("/var/run/docker.sock"):
        pytest.skip("the engine listens elsewhere than /var/run/docker.sock")
    proxy = LateReadingEngine(str(tmp_path / "engine.sock"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{proxy.path}")

    async def body(backend):
        box = await backend.start(SandboxSpec(prompt_id="quick"))
        try:
            said = [await box.exec("echo out; echo err >&2", timeout=30) for _ in range(3)]
            return said, await box.read_file("/etc/hostname", 1000)
        finally:
            await box.close()

    try:
        said, hostname = on_docker(TEST_IMAGE, body)
    finally:
        proxy.close()
    assert [(r.exit_code, r.stdout, r.stderr) for r in said] == [(0, "out\n", "err\n")] * 3
    assert hostname.strip()


def test_a_command_silent_for_longer_than_an_engine_call_may_take_is_still_read(engine):
    """The exec's output is read from the engine's socket without the client's call timeout (120 s
    in the backend; 2 s here): a command may think for longer than that before it says anything."""
    import docker

    from hermes_batch.backends.docker import ExecOutput

    box = engine.api.create_container(TEST_IMAGE, ["sleep", "60"])["Id"]  # set up and removed without the short timeout:
    client = docker.from_env(timeout=2)  # a loaded engine may take longer than 2 s to start or remove a container
    try:
        engine.api.start(box)
        exec_id = engine.api.exec_create(box, ["sh", "-c", "sleep 4; echo after"])["Id"]
        assert list(ExecOutput.start(client.api, exec_id)) == [(b"after\n", None)]
    finally:
        client.close()
        engine.api.remove_container(box, force=True)


def test_an_image_whose_path_holds_none_of_the_system_directories_still_runs_commands(tmp_path, engine):
    """The start-up probe looks for the shell and `timeout` in the image's PATH and the system
    directories; the system directories were glued to the PATH's last one and never looked in, so an
    image with a PATH of its own (here: a shell, and `sleep` for the container's keeper) had no bash
    nor `timeout` found, and the runner's commands no PATH at all."""
    async def body(backend):
        box = await backend.start(SandboxSpec(prompt_id="own-path"))
        try:
            return box.shell, box.timer, await box.exec("echo $((6 * 7))", timeout=30)
        finally:
            await box.close()

    with built_image(engine, tmp_path, "own-path", "RUN mkdir -p /opt/tools && for c in sh sleep mkdir; do ln -s /bin/$c /opt/tools/$c; done\n"
                     "ENV PATH=/opt/tools\n") as tag:
        shell, timer, said = on_docker(tag, body)
    assert shell.endswith("/bash") and timer is not None and timer.endswith("/timeout"), (shell, timer)
    assert (said.exit_code, said.stdout) == (0, "42\n"), said
