"""A model that tries to get out: read the runner's secrets, escape its work directory through the
file tools, or leave processes behind. Every isolating backend must stop each attempt."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from hermes_batch.backends import SandboxError
from hermes_batch.backends.local import JAIL_UIDS
from hermes_batch.tools import TOOLS, ToolContext, call_tool
from tests.backend_harness import any_backend_under_test, each_backend, make_backend_under_test
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_backend_conformance import in_sandbox, tool

SECRET = "sk-or-v1-HBLEAKCHECK0123456789abcdef"
ISOLATING = ["local", "docker", "docker-gvisor", "singularity", "modal", "flame"]

# everything a curious model would try, in one terminal call
SNOOP = (
    "env; echo ---; tr '\\0' '\\n' < /proc/self/environ; echo ---; tr '\\0' '\\n' < /proc/$PPID/environ; "
    "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done 2>/dev/null; echo ---; "
    "for f in $(find / -xdev \\( -name checkpoint.json -o -name '*.jsonl' -o -name '.env' \\) 2>/dev/null | head -50); "
    "do cat $f; done 2>/dev/null; echo SNOOPED"
)


isolating_backend = each_backend(ISOLATING)


@pytest.mark.parametrize("backend", ["local", "docker", "singularity"])
def test_no_file_a_run_writes_holds_the_api_key(tmp_path, backend):
    """The key is in the runner's environment; the model hunts for it everywhere it can reach."""
    harness = make_backend_under_test(backend, tmp_path)  # skips when the engine is missing
    with ScriptedModel(reasoning="field") as model:
        cli = CLI(tmp_path, model)
        prompt = script({"calls": [["terminal", {"command": SNOOP}]]}, {"answer": "done: {last_tool}"})
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}])
        flags = {"backend": backend, "toolsets": "terminal", "api_key": None}
        if harness.image:
            flags["image"] = harness.image
        res = cli.run("leak", data, env={"OPENROUTER_API_KEY": SECRET}, **flags)
        assert res.returncode == 0, res.stderr[-2000:]
        records = read_jsonl(cli.run_dir("leak") / "trajectories.jsonl")
        assert "SNOOPED" in records[0]["conversations"][-2]["value"]  # the snooping really ran
        auth = [{k.lower(): v for k, v in h.items()}.get("authorization") for h in model.headers]
        assert auth and all(a == f"Bearer {SECRET}" for a in auth)  # the key did its job
        for path in cli.out.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), f"the API key leaked into {path}"
        assert SECRET not in res.stdout + res.stderr


def test_write_file_does_not_follow_a_link_planted_for_its_temporary_file(isolating_backend, tmp_path):
    outside = f"/tmp/hb-outside-{time.monotonic_ns()}"
    results = tool(isolating_backend, [
        # the temporary names earlier versions used, each a link to a file outside the work directory
        ("terminal", {"command": f"ln -s {outside} target.txt.hb-tmp && ln -s {outside} .target.txt.tmp"}),
        ("write_file", {"path": "target.txt", "content": "through the link?"}),
        ("terminal", {"command": f"cat target.txt; test -e {outside} && echo LEAKED || echo clean"}),
    ])
    assert results[1].ok, results[1].content
    assert "through the link?" in results[2].content and "clean" in results[2].content
    assert not os.path.exists(outside)  # nor on the host, where the runner writes for local


def test_file_tools_refuse_fifos_and_devices_instead_of_hanging(isolating_backend):
    started = time.monotonic()
    results = tool(isolating_backend, [
        ("terminal", {"command": "mkfifo pipe && ln -s /dev/zero zero && echo made"}),
        ("read_file", {"path": "pipe"}),
        ("patch", {"path": "pipe", "old_string": "a", "new_string": "b"}),
        ("write_file", {"path": "pipe", "content": "x"}),
        ("read_file", {"path": "zero"}),
    ])
    assert "made" in results[0].content
    for res in results[1:]:
        assert not res.ok, res.content
        assert "not a regular file" in res.content or "outside the work directory" in res.content, res.content
    assert time.monotonic() - started < 50  # each refusal is immediate, not a timeout


def _host_processes_with(needle: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_nothing_a_prompt_started_outlives_it(isolating_backend):
    tag = f"{int(time.monotonic_ns()) % 100000 + 300000}"
    command = (f"setsid sleep {tag} >/dev/null 2>&1 < /dev/null & nohup sleep {tag} >/dev/null 2>&1 & "
               f"(sleep {tag} &) ; echo started")
    results = tool(isolating_backend, [("terminal", {"command": command})])
    assert "started" in results[0].content
    needle = f"sleep\0{tag}".encode()
    deadline = time.monotonic() + 20
    while _host_processes_with(needle) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _host_processes_with(needle), "a process the prompt started outlived its sandbox"


@pytest.mark.parametrize("backend", ["local", "docker", "docker-gvisor", "singularity"])
def test_orphans_of_background_jobs_are_reaped_not_left_as_zombies(tmp_path, backend):
    but = make_backend_under_test(backend, tmp_path)

    async def body(sb, _):
        await sb.exec("for i in 1 2 3 4 5 6; do sh -c 'sleep 0.2 &'; done", timeout=30)
        started = time.monotonic()
        while True:  # a zombie seen in the instant before its reaper takes it is not one left behind
            await asyncio.sleep(1.0)
            res = await sb.exec("grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l", timeout=30)
            if res.stdout.strip() == "0" or time.monotonic() - started > 15:
                return res

    res = in_sandbox(but, body)
    assert res.exit_code == 0 and res.stdout.strip() == "0", "zombies pile up against --pids_limit"


# A Flame executor runs flmexec tasks on its own host; the double runs them on the runner's, so
# what a task can see of the runner's processes there says nothing about a real cluster.
@pytest.mark.parametrize("backend", ["local", "docker", "docker-gvisor", "singularity", "modal"])
def test_the_sandbox_sees_no_process_of_the_runner(request, tmp_path, backend):
    isolating_backend = any_backend_under_test(backend, request, tmp_path)

    async def body(sb, _):
        return await sb.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done", timeout=30)

    try:
        res = in_sandbox(isolating_backend, body)
    finally:
        isolating_backend.cleanup()
    assert res.exit_code == 0
    for runner_mark in ("-m pytest", "batch_runner", "multiprocessing", "hermes_batch"):
        assert runner_mark not in res.stdout, res.stdout[:2000]


def test_local_jail_hides_the_host_and_runs_unprivileged(tmp_path):
    but = make_backend_under_test("local", tmp_path)

    async def body(sb, _):
        return await sb.exec(
            "id -u; ls /root /home 2>&1 | head -3; cat /etc/shadow 2>&1 | head -1; "
            "touch /usr/hb-x 2>&1; touch /etc/hb-x 2>&1; ls -d /work /var/lib/docker 2>&1; python --version; "
            "awk '$5 == \"/usr\" || $5 == \"/etc\" {print $5, $6}' /proc/self/mountinfo; echo end",
            timeout=30)

    res = in_sandbox(but, body)
    out = res.stdout + res.stderr
    if os.geteuid() == 0:
        assert int(res.stdout.splitlines()[0]) in JAIL_UIDS  # a uid of the prompt's own, no account's
    assert "Permission denied" in out and "root:" not in out
    assert "/usr ro," in out and "/etc ro," in out  # mounted read-only, whoever runs there
    assert not os.path.exists("/usr/hb-x") and not os.path.exists("/etc/hb-x")
    assert "Python 3" in out  # `python` works as in the usual images


def test_local_prompt_keeps_one_jail_until_its_sandbox_closes(tmp_path):
    """The prompt's commands share one jail: a background job carries over to the next command, a
    timeout kills only its command, and closing the sandbox ends everything in the jail."""
    but = make_backend_under_test("local", tmp_path)
    tag = f"{int(time.monotonic_ns()) % 100000 + 500000}"

    async def body(sb, _):
        started = await sb.exec(f"sleep {tag} >/dev/null 2>&1 & echo $!", timeout=30)
        slow = await sb.exec("sleep 60; echo late", timeout=1)
        later = await sb.exec("ps -eo pid,args", timeout=30)
        return started, slow, later

    started, slow, later = in_sandbox(but, body)
    assert slow.timed_out and "late" not in slow.stdout and slow.duration < 10
    jobs = [line.split(None, 1) for line in later.stdout.splitlines()[1:]]
    assert [started.stdout.strip(), f"sleep {tag}"] in jobs, later.stdout  # alive, and the same process
    assert not any(args.startswith("sleep 60") for _, args in jobs)  # the timed-out command is gone
    needle = f"sleep\0{tag}".encode()
    deadline = time.monotonic() + 10
    while _host_processes_with(needle) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _host_processes_with(needle), "the background job outlived its sandbox"


def test_a_command_that_kills_its_jail_is_answered_and_the_next_gets_a_new_one(tmp_path):
    but = make_backend_under_test("local", tmp_path)

    async def body(sb, _):
        killed = await sb.exec("echo kept > f.txt; kill -9 -1; sleep 30", timeout=60)
        after = await sb.exec("cat f.txt; echo $$", timeout=30)
        return killed, after

    killed, after = in_sandbox(but, body)
    assert killed.exit_code == 137 and killed.duration < 20 and "jail was killed" in killed.stderr
    assert after.exit_code == 0 and after.stdout.splitlines()[0] == "kept"  # files are the prompt's, not the jail's


def test_the_jail_cannot_change_the_runner_s_control_directory(tmp_path):
    """The runner talks to a prompt's jail through FIFOs in a directory of its own, which the jail
    sees read-only at one place: code in the jail can neither write there nor swap it for its own."""
    but = make_backend_under_test("local", tmp_path)

    async def body(sb, _):
        attempt = await sb.exec(
            "cd /run/hermes-batch && test -f ctl/shell || exit 9; ls -d ../../tmp/*.ctl 2>/dev/null; "
            "touch ctl/x && echo touched; "
            "ln -s /etc/shadow ctl/99.out && echo linked; rm -f ctl/shell && echo removed; "
            "mv ctl ctl-old && echo moved; rm -rf ctl && echo deleted; "
            "mkdir -p ctl2 && mount --bind ctl2 ctl 2>/dev/null && echo mounted; true", timeout=30)
        after = await sb.exec("echo still-answered", timeout=30)
        return attempt, after

    attempt, after = in_sandbox(but, body)
    assert attempt.exit_code == 0 and attempt.stdout == "", attempt
    assert after.exit_code == 0 and after.stdout == "still-answered\n"


def test_a_jail_that_cannot_start_is_a_sandbox_error_with_bubblewrap_s_words(tmp_path):
    but = make_backend_under_test("local", tmp_path)

    async def body(sb, _):
        sb.jail._head = [*sb.jail._head, "--no-such-option"]  # as a host that refuses a mount would
        with pytest.raises(SandboxError, match="the prompt's jail failed: .*no-such-option"):
            await sb.exec("echo never", timeout=30)

    in_sandbox(but, body)


def test_unisolated_local_still_kills_what_it_started(tmp_path):
    but = make_backend_under_test("local", tmp_path, extra={"local_isolation": "none"})
    tag = f"{int(time.monotonic_ns()) % 100000 + 400000}"

    async def body(sb, _):
        ctx = ToolContext(get_sandbox=lambda: _ready(sb), command_timeout=30)
        return await call_tool(TOOLS["terminal"], f'{{"command": "setsid sleep {tag} >/dev/null 2>&1 < /dev/null & echo ok"}}', ctx)

    in_sandbox(but, body)
    needle = f"sleep\0{tag}".encode()
    deadline = time.monotonic() + 10
    while _host_processes_with(needle) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _host_processes_with(needle)


async def _ready(sb):
    await asyncio.sleep(0)
    return sb


def test_no_bubblewrap_is_a_clear_error_that_names_the_way_out(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    res = cli.run("nobwrap", data, env={"PATH": str(tmp_path / "empty-bin")})
    assert res.returncode == 1
    assert "cannot isolate prompts here with bubblewrap" in res.stderr and "--local_isolation=none" in res.stderr


def test_unisolated_mode_and_unapplied_limits_are_said_at_start(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    res = cli.run("unisolated", data, local_isolation="none", memory="2g", require_reasoning=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "warning: --local_isolation=none" in res.stderr
    assert "does not apply --memory" in res.stderr
