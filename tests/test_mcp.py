"""MCP servers as toolsets, end to end with real servers: the tests' own (tests/mcp_fixture.py,
written with the `mcp` SDK) and a published one from PyPI (mcp-server-time), both from
scripts/build_mcp_test_site.sh, run in the local jail and in Docker; the scripted model calls them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.backend_harness import docker_status, unavailable
from tests.conftest import CLI, read_jsonl, tool_results_in, write_jsonl
from tests.scripted_model import ScriptedModel, script

SITE = os.environ.get("HERMES_BATCH_MCP_SITE", "/usr/local/lib/hermes-batch-mcp")
IMAGE = os.environ.get("HERMES_BATCH_MCP_IMAGE", "hermes-batch-mcp:test")
FIXTURE = (Path(__file__).parent / "mcp_fixture.py").read_text()
SERVER = {"command": "python3", "args": ["server.py"], "env": {"PYTHONPATH": SITE}, "timeout": 3}
TIME_SERVER = {"command": "python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
               "env": {"PYTHONPATH": SITE}}


def needs_mcp(backend: str) -> dict:
    """The flags that run `backend` with the MCP test servers in reach (skips where they are not)."""
    if not Path(SITE, ".complete").exists():
        unavailable("mcp", f"the MCP test site is not at {SITE} (sh scripts/build_mcp_test_site.sh)")
    if backend == "docker":
        if why := docker_status():
            unavailable("docker", why)
        import docker

        try:
            docker.from_env().images.get(IMAGE)
        except Exception:
            unavailable("mcp", f"the image {IMAGE} is missing (sh scripts/build_mcp_test_site.sh)")
        return {"backend": "docker", "image": IMAGE}
    return {"backend": backend}


def tool_turns(record: dict) -> dict[str, str]:
    return {t["name"]: t["content"] for t in tool_results_in(record)}


def error_of(said: str) -> str:
    """A failed call's message: the tools answer `{"error": ...}`."""
    return json.loads(said)["error"]


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_row_s_server_runs_in_its_sandbox_its_tools_offered_called_and_counted(backend, tmp_path):
    on = needs_mcp(backend)
    flow = script({"calls": [["fx__echo", {"text": "hi"}]]},
                  {"calls": [["fx__write_note", {"path": "note.txt", "text": "hello"}]]},
                  {"calls": [["fx__whoami", {}]]},
                  {"calls": [["fx__broken", {}]]},
                  {"calls": [["fx__picture", {}]]},
                  {"calls": [["fx__slow", {"seconds": 30}]]},
                  {"calls": [["fx__echo", {"text": "again"}]]},
                  {"answer": "done"})
    tag = f"hb-mcp-{tmp_path.name}"
    row = {"prompt": flow, "files": {"server.py": FIXTURE}, "mcp_servers": {"fx": tagged(SERVER, tag)},
           "check": 'test "$(cat note.txt)" = hello'}
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("mcp", write_jsonl(tmp_path / "d.jsonl", [row]), toolsets="terminal", max_turns=12, **on)
        offered = {t["function"]["name"]: t["function"] for t in model.requests[0]["tools"]}
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("mcp") / "trajectories.jsonl")
    assert {"terminal", "fx__echo", "fx__write_note", "fx__slow", "fx__broken", "fx__picture"} <= set(offered)
    assert offered["fx__write_note"]["parameters"]["required"] == ["path", "text"]  # the server's own schema
    assert offered["fx__echo"]["description"] == "Say the text back."
    said = tool_turns(record)
    echoes = [t["content"] for t in tool_results_in(record) if t.get("name") == "fx__echo"]
    assert echoes == ["echo: hi", "echo: again"]  # the second after a call that timed out: a server afresh
    assert "wrote 5 characters to note.txt" in said["fx__write_note"], said
    who = json.loads(said["fx__whoami"])
    assert who["cwd"] == ("/workspace" if backend in ("local", "docker") else who["cwd"])
    assert not [v for v in who["env"] if "API_KEY" in v], who  # nothing of the runner's reaches it
    assert "always fails" in error_of(said["fx__broken"])
    assert "did not answer within 3 s" in error_of(said["fx__slow"])
    assert record["verification"]["status"] == "pass"  # the file the server wrote is the sandbox's: the check saw it
    stats = record["tool_stats"]
    assert stats["fx__echo"] == {"count": 2, "success": 2, "failure": 0}
    assert stats["fx__broken"]["failure"] == 1 and stats["fx__slow"]["failure"] == 1
    assert "fx" in record["toolsets_used"]
    assert any(t.get("images") for t in tool_results_in(record) if t.get("name") == "fx__picture"), record
    if backend == "local":
        assert not _processes_with(tag), "the server outlived its prompt"


def tagged(server: dict, tag: str) -> dict:
    """The server, its command line marked with `tag` (the fixture ignores it): to find its processes."""
    return {**server, "args": [*server["args"], tag]}


def _processes_with(tag: str) -> list[int]:
    """Processes of this machine whose command line holds `tag`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_servers_of_mcp_config_are_listed_at_start_offered_to_every_prompt_and_fingerprinted(tmp_path):
    on = needs_mcp("local")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": TIME_SERVER}}))
    flow = script({"calls": [["time__get_current_time", {"timezone": "Asia/Tokyo"}]]}, {"answer": "done"})
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}])
        res = cli.run("time", data, mcp_config=str(config), distribution="terminal_only", **on)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "MCP servers: time (2 tools)" in res.stderr
        [record] = read_jsonl(cli.run_dir("time") / "trajectories.jsonl")
        answer = json.loads(tool_turns(record)["time__get_current_time"])
        assert answer["timezone"] == "Asia/Tokyo", answer  # the published server's own answer
        assert "time" in record["toolsets_used"]  # every prompt: the distribution does not weigh it
        # the servers are part of what the run is: another server under the same name is another run
        config.write_text(json.dumps({"mcpServers": {"time": {**TIME_SERVER, "args": [*TIME_SERVER["args"][:2],
                                                                                       "--local-timezone", "Asia/Tokyo"]}}}))
        again = cli.run("time", data, resume=True, **on)
    assert again.returncode == 1 and "mcp:time" in again.stderr, again.stderr[-2000:]


def test_a_server_that_cannot_be_used_is_refused_before_any_model_call_naming_it(tmp_path):
    on = needs_mcp("local")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"gone": {"command": "no-such-server-here"},
                                                 "quits": {"command": "python3", "args": ["-c", "print('bye')"]}}}))
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("bad", write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}]), mcp_config=str(config), **on,
                      timeout=300)
        assert res.returncode == 1, res.stderr[-2000:]
        assert "MCP server gone cannot be used" in res.stderr and "no-such-server-here" in res.stderr
        assert "MCP server quits cannot be used" in res.stderr
        assert not model.requests


def test_a_row_whose_server_cannot_start_fails_before_its_first_model_call(tmp_path):
    on = needs_mcp("local")
    rows = [{"prompt": "p", "mcp_servers": {"gone": {"command": "no-such-server-here"}}},
            {"prompt": script({"answer": "fine"})}]
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("rowbad", write_jsonl(tmp_path / "d.jsonl", rows), toolsets="terminal", **on)
        assert len(model.requests) == 1  # the other row's only
    assert res.returncode == 3, res.stderr[-2000:]
    [failure] = read_jsonl(cli.run_dir("rowbad") / "failed.jsonl")
    assert failure["error_kind"] == "mcp_unavailable" and "gone" in failure["error"], failure


def test_declarations_are_read_as_mcp_clients_and_harbor_write_them():
    from hermes_batch.tools.mcp import McpError, read_servers

    servers = read_servers({"mcpServers": {"a": {"command": "x", "args": ["1"]}, "b": {"url": "https://e.com/mcp"}}},
                           "here")
    assert servers["a"].stdio and not servers["b"].stdio
    harbor = read_servers([{"name": "c", "transport": "stdio", "command": "y"}], "task.toml")
    assert list(harbor) == ["c"]
    for bad, why in (({"x y": {"command": "z"}}, "must be a letter"), ({"a": {}}, "not both and not neither"),
                     ({"a": {"url": "https://e.com", "transport": "sse"}}, "SSE transport"),
                     ({"a": {"command": "z", "nope": 1}}, "nope")):
        with pytest.raises(McpError, match=why):
            read_servers(bad, "here")


def test_a_server_by_url_is_reached_at_a_public_address_and_refused_on_this_machine_s_loopback(tmp_path):
    from tests.public_host import PUBLIC_ADDRESS, public_server, why_not

    on = needs_mcp("local")
    if why := why_not():
        pytest.skip(why)
    import subprocess
    import sys

    local = subprocess.Popen([sys.executable, str(Path(__file__).parent / "mcp_fixture.py"), "--http", "127.0.0.1",
                              "18931"], env={**os.environ, "PYTHONPATH": SITE}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    argv = ["/usr/bin/python3", str(Path(__file__).parent / "mcp_fixture.py"), "--http", PUBLIC_ADDRESS, "8080"]
    try:
        with public_server(argv, {"PYTHONPATH": SITE}) as base, ScriptedModel() as model:
            cli = CLI(tmp_path, model)
            flow = script({"calls": [["pub__echo", {"text": "far"}]]}, {"answer": "done"})
            rows = [{"prompt": flow, "mcp_servers": {"pub": {"url": f"{base}/mcp"}}},
                    {"prompt": "p", "mcp_servers": {"near": {"url": "http://127.0.0.1:18931/mcp"}}}]
            time.sleep(1)
            res = cli.run("url", write_jsonl(tmp_path / "d.jsonl", rows), toolsets="terminal", **on)
        assert res.returncode == 3, res.stderr[-2000:]
        records = read_jsonl(cli.run_dir("url") / "trajectories.jsonl")
        [failure] = read_jsonl(cli.run_dir("url") / "failed.jsonl")
    finally:
        local.kill()
    assert [tool_turns(r).get("pub__echo") for r in records] == ["echo: far"]
    assert failure["error_kind"] == "mcp_unavailable" and "internal address" in failure["error"], failure


def test_no_server_outlives_a_runner_killed_mid_call(tmp_path):
    """kill -9 of the runner while a prompt's server runs a call: its workers see it gone and end
    their sandboxes, the server with them."""
    import signal

    on = needs_mcp("local")
    flow = script({"calls": [["fx__slow", {"seconds": 600}]]}, {"answer": "never"})
    tag = f"hb-mcp-{tmp_path.name}"
    row = {"prompt": flow, "files": {"server.py": FIXTURE}, "mcp_servers": {"fx": tagged({**SERVER, "timeout": 900}, tag)}}
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        proc = cli.popen("killed", write_jsonl(tmp_path / "d.jsonl", [row]), toolsets="terminal", **on)
        try:
            deadline = time.monotonic() + 120
            while not _processes_with(tag) or not model.requests:
                assert time.monotonic() < deadline and proc.poll() is None, "the server never started"
                time.sleep(0.2)
            time.sleep(1)
            os.kill(proc.pid, signal.SIGKILL)  # the runner alone, as a crash would
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    deadline = time.monotonic() + 30
    while _processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_with(tag), "a server outlived the runner"


def test_a_harbor_task_s_server_runs_in_its_container_and_its_tests_see_what_it_wrote(tmp_path):
    """A Harbor task declaring [[environment.mcp_servers]] runs (it was refused): the agent's call
    writes through the server in the task's container, and tests/test.sh passes on it; untouched, fails."""
    on = needs_mcp("docker")
    task = tmp_path / "tasks" / "note-task"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "instruction.md").write_text(script({"calls": [["fx__write_note", {"path": "note.txt", "text": "42"}]]},
                                                {"answer": "done"}, text="Write 42 into note.txt."))
    (task / "environment" / "Dockerfile").write_text(f"FROM {on['image']}\nWORKDIR /app\nCOPY server.py /opt/fx/server.py\n")
    (task / "environment" / "server.py").write_text(FIXTURE)
    (task / "tests" / "test.sh").write_text('mkdir -p /logs/verifier\n'
                                            'if [ "$(cat /app/note.txt)" = 42 ]; then echo 1; else echo 0; fi '
                                            '> /logs/verifier/reward.txt\n')
    (task / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 120\n[environment]\n'
        f'[[environment.mcp_servers]]\nname = "fx"\ntransport = "stdio"\ncommand = "python3"\n'
        f'args = ["/opt/fx/server.py"]\nenv = {{PYTHONPATH = "{SITE}"}}\n')
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("harbor", task.parent, backend="docker", toolsets="terminal", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("harbor") / "trajectories.jsonl")
    assert "wrote 2 characters to note.txt in /app" in tool_turns(record)["fx__write_note"]
    assert record["verification"]["status"] == "pass", record["verification"]
    from hermes_batch.checks.task import read_task

    assert list(read_task({"prompt": "p", "harbor_task": str(task)}, tmp_path).mcp_servers) == ["fx"]
