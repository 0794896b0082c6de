"""The Flame backend over real gRPC against the loopback double (flamepy's own stubs), and the
article's two demos end to end through the CLI. An opt-in test talks to a real cluster."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import pytest

pytest.importorskip("flamepy", reason="the Flame backend needs the flame extra: pip install 'hermes-batch[flame]'")

from hermes_batch.backends import BackendSettings, SandboxError, SandboxSpec, load_backend  # noqa: E402
from hermes_batch.tools import TOOLS, ToolContext, call_tool  # noqa: E402
from tests.conftest import CLI, read_jsonl, write_jsonl  # noqa: E402
from tests.flame_double import FlameDouble  # noqa: E402
from tests.scripted_model import script  # noqa: E402

DEMO_DIR = "/tmp/hermes-flamepy-demo"
SALES_CREATE = (
    f"mkdir -p {DEMO_DIR}\ncat > {DEMO_DIR}/sales.csv <<'CSV'\nregion,revenue,cost\neast,120,75\nwest,80,55\n"
    "east,150,90\nwest,100,70\nCSV\nprintf 'sales.csv created\\n'"
)
SALES_COMPUTE = (
    "import csv\nimport json\nimport platform\nfrom pathlib import Path\n"
    f'work = Path("{DEMO_DIR}")\nrows = list(csv.DictReader((work / "sales.csv").open()))\n'
    'revenue = sum(int(row["revenue"]) for row in rows)\nprofit = revenue - sum(int(row["cost"]) for row in rows)\n'
    'summary = {"rows": len(rows), "revenue": revenue, "profit": profit}\n'
    '(work / "summary.json").write_text(json.dumps(summary))\nprint(json.dumps(summary))\nprint(platform.system())'
)
DISCOUNT = (
    "import json\nrevenues = [120, 80, 150, 100]\ncosts = [75, 55, 90, 70]\ndiscount = {d}\n"
    "if not 0 <= discount <= 1:\n    raise ValueError(\"discount must be between 0 and 1\")\n"
    "revenue = round(sum(revenues) * (1 - discount), 2)\nprofit = round(revenue - sum(costs), 2)\n"
    'print(json.dumps({{\n    "discount": discount,\n    "revenue": revenue,\n    "profit": profit,\n}}))'
)


@pytest.fixture
def double(monkeypatch, tmp_path):
    d = FlameDouble()
    monkeypatch.setenv("FLAME_ENDPOINT", d.start())
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    yield d
    d.stop()


def settings(**extra) -> BackendSettings:
    return BackendSettings(run_label=f"flame-{uuid.uuid4().hex[:6]}", **extra)


def with_backend(body, **extra):
    async def main():
        backend = load_backend("flame", settings(**extra))
        await backend.setup()
        try:
            return await body(backend)
        finally:
            await backend.shutdown()

    return asyncio.run(main())


async def call(sandbox, name, **args):
    async def get():
        return sandbox

    return await call_tool(TOOLS[name], json.dumps(args), ToolContext(get_sandbox=get, command_timeout=30))


def tool_result(record: dict, turn: int):
    body = json.loads(record["conversations"][turn]["value"].split("\n", 1)[1].rsplit("\n", 1)[0])
    return body["content"]


def test_demo_1_three_sandbox_calls_share_files_through_the_cli(double, tmp_path, model):
    prompt = script(
        {"calls": [["sandbox", {"code": SALES_CREATE, "language": "shell", "timeout": 30}]]},
        {"calls": [["sandbox", {"code": SALES_COMPUTE, "language": "python", "timeout": 30}]]},
        {"calls": [["sandbox", {"code": f"cat {DEMO_DIR}/summary.json", "language": "shell", "timeout": 30}]]},
        {"answer": "The report says {last_tool}"},
        text="Use the flamepy sandbox tool to create a small sales CSV, calculate its total revenue and profit "
             "in a separate Python call, and read back the saved report in a third call.",
    )
    cli = CLI(tmp_path, model)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}])
    try:
        res = cli.run("demo1", data, backend="flame", toolsets="code")
    finally:
        os.system(f"rm -rf {DEMO_DIR}")
    assert res.returncode == 0, res.stderr
    [record] = read_jsonl(cli.run_dir("demo1") / "trajectories.jsonl")
    assert tool_result(record, 3) == "sales.csv created\n"
    assert tool_result(record, 5) == '{"rows": 4, "revenue": 450, "profit": 160}\nLinux\n'
    # the file's text, as the model read it (a text result is never re-read as JSON in the record)
    assert json.loads(tool_result(record, 7)) == {"rows": 4, "revenue": 450, "profit": 160}
    assert record["tool_stats"]["sandbox"] == {"count": 3, "success": 3, "failure": 0}
    # the three calls ran in one persistent Flame sandbox session, now released
    sandboxes = [s for s in double.sessions.values() if "-sbx-" in s.id]
    assert len(sandboxes) == 1 and len(sandboxes[0].tasks) >= 3
    assert sandboxes[0].spec.max_instances == 1
    assert double.open_ids() == []


def test_demo_2_four_discount_scenarios_in_one_session_call(double, tmp_path, model):
    codes = [DISCOUNT.format(d=d) for d in (0.0, 0.1, 0.2, 1.2)]
    prompt = script({"calls": [["session", {"codes": codes, "language": "python", "timeout": 30}]]},
                    {"answer": "{last_tool}"},
                    text="Use the flamepy session tool to evaluate discounts of 0%, 10%, 20%, and 120%.")
    cli = CLI(tmp_path, model)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}])
    res = cli.run("demo2", data, backend="flame", toolsets="code")
    assert res.returncode == 0, res.stderr
    [record] = read_jsonl(cli.run_dir("demo2") / "trajectories.jsonl")
    results = tool_result(record, 3)
    assert [r["exit_code"] for r in results] == [0, 0, 0, 1]
    assert results[0] == {"exit_code": 0, "stdout": '{"discount": 0.0, "revenue": 450.0, "profit": 160.0}\n', "stderr": ""}
    assert [json.loads(r["stdout"])["revenue"] for r in results[:3]] == [450.0, 405.0, 360.0]
    assert [json.loads(r["stdout"])["profit"] for r in results[:3]] == [160.0, 115.0, 70.0]
    assert "ValueError: discount must be between 0 and 1" in results[3]["stderr"]
    shared = [s for s in double.sessions.values() if "-ssn-" in s.id]
    assert len(shared) == 1 and len(shared[0].tasks) == 4 and not shared[0].spec.HasField("max_instances")
    assert double.open_ids() == []  # released at the end of the run


def test_session_submits_everything_before_collecting_and_runs_in_parallel(double):
    codes = [f"import time\ntime.sleep(1)\nprint({i})" for i in range(6)]

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            started = time.monotonic()
            results = await sb.run_snippets(codes, language="python", timeout=30)
            return results, time.monotonic() - started
        finally:
            await sb.close()

    results, took = with_backend(body)
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(6)]
    assert double.max_running == 6  # all six were running at once on the cluster


def test_one_snippets_infrastructure_failure_is_minus_one_and_keeps_the_others(double):
    double.task_fault = lambda sid, tid: "fail" if "-ssn-" in sid and tid == "2" else None

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            return await call(sb, "session", codes=["print(1)", "print(2)", "print(3)"])
        finally:
            await sb.close()

    res = with_backend(body)
    out = json.loads(res.content)
    assert res.ok and [o["exit_code"] for o in out] == [0, -1, 0]
    assert "injected executor failure" in out[1]["stderr"] and out[2]["stdout"] == "3\n"


def test_a_stale_session_is_reacquired_and_the_submission_retried_once(double):
    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            first = await call(sb, "session", codes=["print('a')"])
            [shared] = [i for i in double.open_ids() if "-ssn-" in i]
            double.close_externally(shared)  # e.g. an operator ran `flmctl close -s`
            second = await call(sb, "session", codes=["print('b')", "print('c')"])
            double.fail_create_task[f"{shared}-1"] = 1  # one refused submission: retried on a re-acquired session
            third = await call(sb, "session", codes=["print('d')"])
            double.fail_create_task[f"{shared}-1"] = 5  # refused again after the retry: the call fails clearly
            fourth = await call(sb, "session", codes=["print('e')"])
            return shared, first, second, third, fourth
        finally:
            await sb.close()

    shared, first, second, third, fourth = with_backend(body)
    assert json.loads(first.content)[0]["stdout"] == "a\n"
    assert [o["stdout"] for o in json.loads(second.content)] == ["b\n", "c\n"]
    assert f"{shared}-1" in double.sessions  # the closed id kept; a new generation took over
    assert json.loads(third.content)[0]["stdout"] == "d\n"
    assert not fourth.ok and "executor lost" in fourth.content


def test_sandbox_ids_reopen_while_open_and_move_to_a_new_generation_when_closed(double):
    label = f"flame-{uuid.uuid4().hex[:6]}"

    async def one(write: str | None):
        backend = load_backend("flame", BackendSettings(run_label=label, keep_flame_sessions=True))
        await backend.setup()
        sb = await backend.start(SandboxSpec(prompt_id="same-prompt"))
        try:
            if write:
                await sb.exec(f"echo {write} > keep.txt", language="shell", timeout=30)
            seen = await sb.exec("cat keep.txt 2>/dev/null || echo none", language="shell", timeout=30)
            return sb.session_id, seen.stdout.strip()
        finally:
            await sb.close()
            await backend.shutdown()

    sid1, seen1 = asyncio.run(one("first"))
    sid2, seen2 = asyncio.run(one(None))  # a restarted process reopens the open sandbox: its files are there
    double.close_externally(sid1)
    sid3, seen3 = asyncio.run(one(None))
    assert sid1 == sid2 and seen1 == seen2 == "first"
    assert sid3 == f"{sid1}-1" and seen3 == "none"
    assert "-sbx-" in sid1 and sid1.endswith("same-prompt")


def test_machine_ids_follow_the_article(double):
    from hermes_batch.backends.flame import machine_id

    try:
        mac = machine_id()
    except SandboxError as exc:
        pytest.skip(f"this host has no physical network interface: {exc}")

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        await call(sb, "session", codes=["print(1)"])
        await sb.close()
        return sb.session_id

    sid = with_backend(body, flame_id_scheme="machine")
    assert sid == f"hermes-sandbox-{mac}"
    assert f"hermes-session-{mac}" in double.open_ids()  # machine-wide sessions stay open, as in the article
    assert sid in double.open_ids()


def test_pip_installs_go_to_site_packages_on_the_python_path(double):
    name = f"hbmod_{uuid.uuid4().hex[:8]}"

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            env = await call(sb, "sandbox", code="import os, sys\nprint(os.environ['PIP_TARGET'])\nprint('/tmp/site-packages' in sys.path)")
            put = await call(sb, "sandbox", language="shell",
                             code=f"echo 'ANSWER = 42' > \"$PIP_TARGET/{name}.py\"")  # what `pip install` would leave
            use = await call(sb, "sandbox", code=f"import {name}\nprint({name}.ANSWER)")
            return env, put, use
        finally:
            os.system(f"rm -f /tmp/site-packages/{name}.py")
            await sb.close()

    env, put, use = with_backend(body)
    assert env.content == "/tmp/site-packages\nTrue\n" and put.ok and use.content == "42\n"


def test_output_is_capped_below_the_grpc_message_limit(double):
    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            return await sb.exec("import sys\nsys.stdout.write('x' * 5_000_000)\nprint('END')", language="python", timeout=60)
        finally:
            await sb.close()

    res = with_backend(body)
    assert res.exit_code == 0 and len(res.stdout) < 250_000
    assert "omitted" in res.stdout and res.stdout.rstrip().endswith("END")


def test_waits_are_bounded_when_a_task_never_finishes(double):
    double.task_fault = lambda sid, tid: "hang" if tid == "3" else None

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))  # task 1: its start-up probe
        try:
            ok = await sb.exec("echo fine", language="shell", timeout=5)  # task 2
            started = time.monotonic()
            with pytest.raises(SandboxError, match="timeout"):
                await sb.exec("echo never", language="shell", timeout=1)  # task 3 hangs
            return ok, time.monotonic() - started
        finally:
            sb._closed = True  # its session cannot close while the hung task runs

    ok, took = with_backend(body, flame_wait_grace=1.0)
    assert ok.stdout == "fine\n" and took < 10  # its 1 s limit and 1 s grace, not a wait for the hung task


def test_an_unreachable_cluster_is_a_clear_error_within_seconds(tmp_path, model, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cli = CLI(tmp_path, model)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    started = time.monotonic()
    res = cli.run("noflame", data, backend="flame", env={"FLAME_ENDPOINT": "http://127.0.0.1:9"})
    assert res.returncode == 1
    assert "cannot reach the Flame cluster at http://127.0.0.1:9 within 5 s" in res.stderr
    assert time.monotonic() - started < 45  # its 5 s deadline plus a CLI's start on a busy machine (20.2 s seen), not a hang
    res = cli.run("noscheme", data, backend="flame", env={"FLAME_ENDPOINT": "127.0.0.1:9"})
    assert res.returncode == 1 and "has no scheme" in res.stderr


def test_proxy_settings_do_not_touch_the_sdk_connection(double, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("grpc_proxy", "http://127.0.0.1:9")

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            return await sb.exec("echo through", language="shell", timeout=30)
        finally:
            await sb.close()

    assert with_backend(body).stdout == "through\n"


def test_keep_flame_sessions_leaves_them_open(double, tmp_path, model):
    cli = CLI(tmp_path, model)
    prompt = script({"calls": [["session", {"codes": ["print(1)"]}], ["sandbox", {"code": "print(2)"}]]}, {"answer": "k"})
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}])
    res = cli.run("keep", data, backend="flame", toolsets="code", keep_flame_sessions=True)
    assert res.returncode == 0, res.stderr
    kinds = sorted(i.split("-")[1] for i in double.open_ids())
    assert kinds == ["sbx", "ssn"]


@pytest.mark.flame_real
def test_against_a_real_flame_cluster():
    """Opt-in: HERMES_BATCH_FLAME_REAL=1 with FLAME_ENDPOINT (or ~/.flame/flame.yaml) naming a cluster with flmexec."""
    if os.environ.get("HERMES_BATCH_FLAME_REAL") != "1":
        pytest.skip("no real Flame cluster configured: set HERMES_BATCH_FLAME_REAL=1 and FLAME_ENDPOINT to run this")

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id=f"real-{uuid.uuid4().hex[:6]}"))
        try:
            a = await call(sb, "sandbox", code="print(6 * 7)")
            b = await call(sb, "session", codes=["print(1)", "raise SystemExit(3)"])
            return a, b
        finally:
            await sb.close()

    a, b = with_backend(body, flame_connect_timeout=10.0)
    assert a.content == "42\n"
    assert [o["exit_code"] for o in json.loads(b.content)] == [0, 3]


def test_many_concurrent_session_calls_in_one_worker_cannot_starve_its_thread_pool(request, tmp_path):
    """More `session` calls at once than the worker has threads for Flame: each used to hold a
    thread while waiting on jobs queued behind it in the same pool, a deadlock."""
    from tests.flame_double import flame_backend_under_test
    from tests.test_backend_conformance import in_sandbox

    but = flame_backend_under_test(request, tmp_path)
    but.settings.flame_threads = 3
    calls = 6

    async def body(sb, _):
        batches = [[f"print({c * 10 + i})" for i in range(3)] for c in range(calls)]
        return await asyncio.wait_for(
            asyncio.gather(*(sb.run_snippets(codes, language="python", timeout=30) for codes in batches)), 120)

    try:
        results = in_sandbox(but, body)
    finally:
        but.cleanup()
    assert [[r.stdout.strip() for r in batch] for batch in results] == [
        [str(c * 10 + i) for i in range(3)] for c in range(calls)]
