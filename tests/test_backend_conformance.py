"""The one conformance suite every backend passes: the sandbox protocol, then every tool on top of it."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from hermes_batch.backends import SandboxError, SandboxSpec
from hermes_batch.backends.base import MAX_INLINE_CODE
from hermes_batch.checks.task import Task
from hermes_batch.checks.verdicts import check_command
from hermes_batch.tools import TOOLS, ToolContext, call_tool
from tests.backend_harness import ALL_BACKENDS, each_backend

backend_under_test = each_backend(ALL_BACKENDS)


def in_sandbox(but, body):
    """Start a backend and one sandbox, run `body(sandbox, backend)`, always close both."""

    async def main():
        backend = but.make()
        await backend.setup()
        sandbox = await backend.start(SandboxSpec(prompt_id=f"p-{time.monotonic_ns()}", image=but.image))
        try:
            return await body(sandbox, backend)
        finally:
            await sandbox.close()
            await backend.shutdown()

    return asyncio.run(main())


def tool(but, calls):
    """Run tool calls [(name, args), ...] in order in one sandbox; return their ToolResults."""

    async def body(sandbox, backend):
        async def get():
            return sandbox

        ctx = ToolContext(get_sandbox=get, command_timeout=30)
        return [await call_tool(TOOLS[name], json.dumps(args), ctx) for name, args in calls]

    return in_sandbox(but, body)


# --- the protocol ------------------------------------------------------------------------------

def test_a_spawned_command_reads_what_the_runner_writes_and_ends_when_closed(backend_under_test):
    """Sandbox.spawn (an MCP server over stdio): its stdin and stdout stay open to the runner; its
    stderr's end is kept; closing it ends it. Modal and Flame say they cannot."""
    tag = f"hb-spawn-{time.monotonic_ns()}"  # its own: the unisolated backend sees every process of the machine
    echo = (f"import sys  # {tag}\nfor line in sys.stdin:\n    print('got', line.strip(), flush=True)\n"
            "print('bye', file=sys.stderr)")

    async def body(sb, _):
        try:
            proc = await sb.spawn(["python3", "-u", "-c", echo])
        except SandboxError as exc:
            return str(exc)
        lines = []
        for word in ("one", "two"):
            proc.write(f"{word}\n".encode())
            await proc.drain()
            lines.append(await asyncio.wait_for(proc.stdout.readline(), 30))
        ended = await sb.spawn(["sh", "-c", "read x; echo \"$x\"; echo said >&2; exit 3"])
        ended.write(b"last\n")
        await ended.drain()
        last = (await asyncio.wait_for(ended.stdout.readline(), 30), await asyncio.wait_for(ended.wait(), 30))
        await asyncio.sleep(0.5)  # its stderr, read beside its exit
        said = ended.stderr_tail()
        await ended.close()
        await proc.close()
        gone = await sb.exec(f"ps -eo args | grep -c '[{tag[0]}]{tag[1:]}' || true", timeout=30)
        return lines, last, said, gone.stdout.strip()

    got = in_sandbox(backend_under_test, body)
    if backend_under_test.name in ("modal", "flame"):
        assert "cannot keep a command's standard input open" in got
        return
    lines, last, said, running = got
    assert lines == [b"got one\n", b"got two\n"] and last == (b"last\n", 3) and "said" in said, got
    assert running == "0", got  # closed: it ended


def test_exec_keeps_exit_code_stdout_and_stderr_apart(backend_under_test):
    async def body(sb, _):
        return await sb.exec("echo out; echo err >&2; exit 3", language="shell", timeout=30)

    res = in_sandbox(backend_under_test, body)
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (3, "out\n", "err\n", False)


def test_a_command_and_its_variables_arrive_as_written(backend_under_test):
    """Nothing on the way expands them (apptainer evaluated APPTAINERENV_* values: a model's `$i`,
    quotes and backquotes were run before its command)."""
    value = "a $i '$HOME' \"${j}\" `echo bq` $(echo dollar) \\d"

    async def body(sb, _):
        direct = await sb.exec('printf %s "$X"', language="shell", timeout=30, env={"X": value})
        ctx = ToolContext(get_sandbox=lambda: asyncio.sleep(0, sb), command_timeout=30)
        loop = await call_tool(TOOLS["terminal"], json.dumps({"command": "for i in 1 2; do printf '%s,' \"$i\"; done"}), ctx)
        return direct, json.loads(loop.content)

    direct, loop = in_sandbox(backend_under_test, body)
    assert direct.stdout == value, direct.stdout
    assert loop["output"] == "1,2,", loop


def test_exec_runs_python(backend_under_test):
    async def body(sb, _):
        return await sb.exec("import sys\nprint(sum(range(10)))\nsys.exit(4)", language="python", timeout=30)

    res = in_sandbox(backend_under_test, body)
    assert res.exit_code == 4 and res.stdout.strip() == "45"


def test_timeout_really_kills_the_command(backend_under_test):
    async def body(sb, _):
        started = time.monotonic()
        res = await sb.exec("sleep 8; touch late-file", language="shell", timeout=1)
        took = time.monotonic() - started
        await asyncio.sleep(max(0.0, started + 8.5 - time.monotonic()))  # past when it would have touched it
        after = await sb.exec("ls", language="shell", timeout=30)
        return res, took, after

    res, took, after = in_sandbox(backend_under_test, body)
    assert res.timed_out and res.exit_code == 124
    assert took < 6  # the 1 s limit, not the command's 8 s (slack for a busy machine)
    assert "late-file" not in after.stdout  # the command did not go on running after the timeout


# Flame's exec waits for its task in a thread that a cancel does not reach: the command gives way,
# and then its sandbox's close waits out that thread (about 45 s here), so it is left out of this one
cancelled_backend = each_backend([b for b in ALL_BACKENDS if b != "flame"])


def test_a_cancelled_command_gives_way_at_once(cancelled_backend):
    """A prompt stopped mid-command (a worker whose run was killed cancels it) must not wait for the
    command: on Apptainer its `timeout` keeps a process group of its own in the instance, which the
    kill of `apptainer exec` does not reach, and the cancelled exec waited for it to end, so a
    harness outlived its killed run, its calls still answered, up to the prompt's deadline."""

    async def body(sb, _):
        running = asyncio.ensure_future(sb.exec("sleep 300; echo never", language="shell", timeout=600))
        await asyncio.sleep(2)
        running.cancel()
        started = time.monotonic()
        done, _ = await asyncio.wait({running}, timeout=20)  # (not wait_for: it would wait out a hung cancel)
        return bool(done), time.monotonic() - started

    gave_way, took = in_sandbox(cancelled_backend, body)
    assert gave_way and took < 10, f"the cancelled command held on {took:.0f} s"


def test_workdir_is_writable_and_the_default_cwd(backend_under_test):
    async def body(sb, _):
        return sb.workdir, await sb.exec("pwd; touch made-here && ls", language="shell", timeout=30)

    workdir, res = in_sandbox(backend_under_test, body)
    assert res.exit_code == 0
    assert res.stdout.splitlines()[0] == workdir
    assert "made-here" in res.stdout


def test_runner_secrets_do_not_reach_the_sandbox(backend_under_test, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-XYZZY-1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-XYZZY-2")

    async def body(sb, _):
        return await sb.exec("env", language="shell", timeout=30)

    res = in_sandbox(backend_under_test, body)
    assert res.exit_code == 0 and "PATH=" in res.stdout
    assert "XYZZY" not in res.stdout


def test_files_round_trip_binary_and_large(backend_under_test):
    blob = bytes(range(256)) * 1200 + "ünïcode\n".encode()

    async def body(sb, _):
        path = os.path.join(sb.workdir, "deep/dir/blob.bin")
        await sb.write_file(path, blob)
        back = await sb.read_file(path, len(blob) + 10)
        head = await sb.read_file(path, 100)
        size = await sb.exec("wc -c < deep/dir/blob.bin", language="shell", timeout=30)
        return back, head, size

    back, head, size = in_sandbox(backend_under_test, body)
    assert back == blob and head == blob[:100]
    assert int(size.stdout.strip()) == len(blob)


def lose_output(sandbox, times: int, match: str = "") -> list[int]:
    """Make the sandbox's next `times` runner commands holding `match` come back as a loaded engine
    sometimes hands them: exit 0, the output lost on its way. Returns the count of those lost, as it grows."""
    real, lost = sandbox.exec, [0]

    async def exec_(code, **kw):
        res = await real(code, **kw)
        if kw.get("runner") and match in code and lost[0] < times:
            lost[0] += 1
            return type(res)(0, "", "", res.duration, False)
        return res

    sandbox.exec = exec_
    return lost


def test_an_output_lost_on_its_way_is_never_read_as_an_empty_file_or_an_empty_result(backend_under_test):
    """An empty reward.txt fails its check, and a result directory read as empty makes exit 0 a pass:
    either would be a wrong verdict."""
    check = Task(check='echo 0.5 > "$RESULT_DIR/reward.txt"')

    async def body(sb, _):
        path = os.path.join(sb.workdir, "reward.txt")
        await sb.write_file(path, b"0.5\n")
        await sb.write_file(os.path.join(sb.workdir, "empty.txt"), b"")
        empty = await sb.read_file(os.path.join(sb.workdir, "empty.txt"), 100)
        lost = lose_output(sb, 1)
        once = await sb.read_file(path, 100)
        lose_output(sb, 2)
        try:
            twice: bytes | Exception = await sb.read_file(path, 100)
        except SandboxError as exc:
            twice = exc
        lose_output(sb, 1, match="for f in")  # the listing of $RESULT_DIR
        listed_once = await check_command(sb, check, timeout=30, pass_score=1.0)
        lose_output(sb, 2, match="for f in")
        listed_twice = await check_command(sb, check, timeout=30, pass_score=1.0)
        return empty, once, lost[0], twice, listed_once, listed_twice

    empty, once, lost, twice, listed_once, listed_twice = in_sandbox(backend_under_test, body)
    assert empty == b"" and once == b"0.5\n"
    if lost:  # a backend that reads through its commands (the local jail reads the host's file itself)
        assert isinstance(twice, SandboxError) and "lost" in str(twice), twice
    assert (listed_once.status, listed_once.score) == ("fail", 0.5), listed_once
    assert listed_twice.status == "error" and "lost" in listed_twice.error, listed_twice


def test_resolve_follows_symlinks(backend_under_test):
    async def body(sb, _):
        await sb.exec("mkdir -p real && ln -s real link", language="shell", timeout=30)
        return sb.workdir, await sb.resolve(os.path.join(sb.workdir, "link/x"))

    workdir, resolved = in_sandbox(backend_under_test, body)
    assert resolved == os.path.join(workdir, "real/x")


def test_code_longer_than_one_argv_string_runs(backend_under_test):
    code = "x = 1\n" * (MAX_INLINE_CODE // 6 + 100) + "print('long ok')"

    async def body(sb, _):
        return await sb.exec(code, language="python", timeout=60)

    res = in_sandbox(backend_under_test, body)
    assert res.exit_code == 0 and res.stdout.strip() == "long ok"


def test_huge_output_is_bounded_head_and_tail(backend_under_test):
    async def body(sb, _):
        return await sb.exec("echo FIRST; head -c 3000000 /dev/zero | tr '\\0' 'x'; echo; echo LAST",
                             language="shell", timeout=60, output_limit=100_000)

    res = in_sandbox(backend_under_test, body)
    assert res.exit_code == 0
    assert len(res.stdout) < 110_000
    assert res.stdout.startswith("FIRST") and res.stdout.rstrip().endswith("LAST")
    assert "omitted" in res.stdout


def test_snippets_run_in_parallel_in_fresh_spaces_in_input_order(backend_under_test):
    # each of the first two prints when it started and ended; parallel means the spans overlap
    span = "import time, os\nt0 = time.time()\ntime.sleep(4)\n{body}\nprint(t0, time.time())"  # starts may lag
    codes = [
        span.format(body="open('mine', 'w').write('a')\nprint('first', sorted(os.listdir('.')))"),
        span.format(body="print('second', sorted(os.listdir('.')))"),
        "raise ValueError('discount must be between 0 and 1')",
        "print('fourth')",
    ]

    async def body(sb, _):
        return await sb.run_snippets(codes, language="python", timeout=30)

    results = in_sandbox(backend_under_test, body)
    assert [r.exit_code for r in results] == [0, 0, 1, 0], results
    assert results[0].stdout.splitlines()[0] == "first ['mine']"
    assert results[1].stdout.splitlines()[0] == "second []"  # no snippet sees another's files
    assert "ValueError: discount must be between 0 and 1" in results[2].stderr
    assert results[3].stdout.strip() == "fourth"
    (s1, e1), (s2, e2) = (map(float, r.stdout.splitlines()[1].split()) for r in results[:2])
    assert max(s1, s2) < min(e1, e2), results  # the two ran side by side


# --- every tool on top of it ---------------------------------------------------------------------

def test_a_command_that_leaves_a_job_running_returns_when_it_ends(backend_under_test):
    """Found in review: on Apptainer and the unisolated local backend, a command that left a job
    running with its output still open (`server &`, as agents start a server and go on) held its
    caller until that job ended, or until the command's timeout."""
    async def body(sb, backend):
        started = time.monotonic()
        result = await sb.exec("sleep 90 & echo hi", timeout=180)
        return result, time.monotonic() - started

    result, took = in_sandbox(backend_under_test, body)
    assert result.ok and result.stdout.strip() == "hi", result
    assert took < 60, f"the command returned {took:.0f} s after it started, with its job (90 s) in the background"


def test_end_processes_ends_every_background_job_and_keeps_the_files(backend_under_test):
    """What a check relies on: nothing the agent started runs on (a detached job, a job that forks
    all the time), its files stay, and the sandbox still runs commands."""
    token = f"hb-end-{time.monotonic_ns()}"
    pattern = f"{token[:6]}[-]{token[7:]}"  # matches the token, not the grep looking for it
    count = f"grep -l {pattern} /proc/[0-9]*/cmdline 2>/dev/null | wc -l"

    async def body(sb, backend):
        started = await sb.exec(  # the token is put together, so only the three jobs' command lines hold it
            f"t={token[:6]}; t=$t-{token[7:]}; echo kept > marker.txt; "
            "(setsid python3 -c 'import time; time.sleep(300)' $t >/dev/null 2>&1 &); "
            "python3 -c 'import time; time.sleep(300)' $t >/dev/null 2>&1 & "
            "sh -c 'while :; do sleep 0.05; done' $t >/dev/null 2>&1 & echo started", timeout=30)
        pythons = f"grep -l 'sleep(300).*{pattern}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
        before = await sb.exec(f"for i in $(seq 100); do [ $({pythons}) -ge 2 ] && break; sleep 0.05; done; {count}",
                               timeout=30)  # once both have started
        try:
            await sb.end_processes()
            after = await sb.exec(f"{count}; grep -l {pattern} /proc/[0-9]*/cmdline 2>/dev/null", timeout=30)
        except SandboxError as exc:  # never a wrong verdict: a check then errs, and says why
            if "container ended" in str(exc) and getattr(backend.settings, "runtime", None):
                # its own threads past the container's process limit ended it, until they were given room
                # (GVISOR_THREADS); kept for an engine crash of another kind, which is never a verdict
                pytest.xfail(f"gVisor ended the container while its processes were ended ({exc})")
            raise
        marker = await sb.exec("cat marker.txt", timeout=30)
        return started, before, after, marker, backend.name

    started, before, after, marker, name = in_sandbox(backend_under_test, body)
    assert started.ok, started.stderr
    # on Flame a task's runner ends what its code started already, before it reports; elsewhere the
    # looping job's forks hold its command line for a moment before they exec sleep
    assert int(before.stdout) == 0 if name == "flame" else int(before.stdout) >= 3, before
    assert int(after.stdout.split()[0]) == 0, after
    assert marker.stdout.strip() == "kept"


def test_terminal_working_directory_persists(backend_under_test):
    results = tool(backend_under_test, [
        ("terminal", {"command": "mkdir -p sub/dir && cd sub/dir && echo one > f.txt"}),
        ("terminal", {"command": "pwd; cat f.txt"}),
        ("terminal", {"command": "cd .. && pwd"}),
        ("terminal", {"command": "exit 7"}),
        ("terminal", {"command": "pwd"}),
    ])
    outs = [json.loads(r.content) for r in results]
    assert all(r.ok for r in results)  # a non-zero exit is the command's business, not a tool failure
    assert outs[1]["output"].splitlines()[0].endswith("/sub/dir") and outs[1]["output"].splitlines()[1] == "one"
    assert outs[2]["output"].endswith("/sub")
    assert outs[3]["exit_code"] == 7
    assert outs[4]["output"].endswith("/sub")


def test_terminal_timeout_is_a_failed_call(backend_under_test):
    """Answered as the Hermes Agent answers it: exit code 124, a note at the end of the output."""
    [res] = tool(backend_under_test, [("terminal", {"command": "echo started; sleep 10", "timeout": 1})])
    out = json.loads(res.content)
    assert not res.ok and out["exit_code"] == 124 and out["error"] is None, out
    assert out["output"].startswith("started\n") and out["output"].endswith("ran past its timeout of 1 s]"), out


def test_file_tools_read_write_patch_search(backend_under_test):
    results = tool(backend_under_test, [
        ("write_file", {"path": "pkg/mod.py", "content": "def f():\n    return 1\n\ndef g():\n    return 2\n"}),
        ("read_file", {"path": "pkg/mod.py", "offset": 4, "limit": 2}),
        ("patch", {"path": "pkg/mod.py", "old_string": "return 2", "new_string": "return 20"}),
        ("patch", {"path": "pkg/mod.py", "old_string": "    return", "new_string": "x"}),
        ("patch", {"path": "pkg/mod.py", "old_string": "nowhere", "new_string": "x"}),
        ("search_files", {"pattern": "return [0-9]+0", "path": "."}),
        ("search_files", {"pattern": "zzz-nothing"}),
        ("read_file", {"path": "missing.txt"}),
        ("write_file", {"path": "unended.txt", "content": "one\ntwo\nthree"}),  # no newline at its end
        ("read_file", {"path": "unended.txt", "offset": 3}),
    ])
    w, r, p_ok, p_many, p_none, s_hit, s_none, r_missing, _, r_unended = (json.loads(x.content) for x in results)
    assert all(x.ok for x in results[:3]) and all(x.ok for x in results[5:7]) and results[9].ok
    where = w["resolved_path"]  # as the sandbox sees it
    assert where.endswith("/pkg/mod.py") and w["files_modified"] == [where] and w["bytes_written"] == 45
    assert w["lint"] == {"status": "ok", "output": ""}
    # numbered as the Hermes Agent numbers: the slice split at each newline, its last one's empty line too
    assert r == {"content": "4|def g():\n5|    return 2\n6|", "total_lines": 5, "file_size": 45, "truncated": False,
                 "is_binary": False, "is_image": False}, r
    assert r_unended["content"] == "3|three" and r_unended["total_lines"] == 2  # newlines counted, as `wc -l` does
    assert p_ok["success"] and p_ok["diff"].startswith(f"--- a/{where}\n+++ b/{where}\n") and "+    return 20" in p_ok["diff"]
    assert not results[3].ok and p_many["success"] is False and "occurs 2 times" in p_many["error"]
    assert not results[4].ok and p_none["success"] is False and "not found" in p_none["error"]
    assert s_hit == {"total_count": 1, "matches": [{"path": "./pkg/mod.py", "line": 5, "content": "    return 20"}]}
    assert s_none == {"total_count": 0}
    assert not results[7].ok and r_missing["error"] == "file not found: missing.txt"


def test_reading_an_unchanged_file_again_is_a_stub_then_a_refusal(backend_under_test):
    """As the Hermes Agent answers a repeated read: the conversation does not carry the file twice;
    once the file changed, it is read afresh."""
    read = ("read_file", {"path": "a.txt"})
    results = tool(backend_under_test, [("write_file", {"path": "a.txt", "content": "one\n"}), read, read, read,
                                        ("write_file", {"path": "a.txt", "content": "two\n"}), read])
    _, first, again, third, _, changed = (json.loads(r.content) for r in results)
    assert first["content"] == "1|one\n2|" and again["status"] == "unchanged" and again["content_returned"] is False
    assert not results[3].ok and third["already_read"] == 3, third
    assert results[5].ok and changed["content"] == "1|two\n2|", changed


def test_file_tools_cannot_leave_the_work_directory(backend_under_test):
    results = tool(backend_under_test, [
        ("read_file", {"path": "../../../../etc/passwd"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("write_file", {"path": "../escape.txt", "content": "x"}),
        ("terminal", {"command": "ln -s /etc sneaky"}),
        ("read_file", {"path": "sneaky/passwd"}),
        ("write_file", {"path": "sneaky/evil", "content": "x"}),
        ("search_files", {"pattern": "root", "path": "/etc"}),
    ])
    for res in results[:3] + results[4:]:
        assert not res.ok, res.content
        assert "outside the work directory" in res.content or "leads outside" in res.content
    assert "root:" not in "".join(r.content for r in results)


def test_sandbox_tool_keeps_files_between_calls(backend_under_test):
    # the Flame article's first demo, as three calls of the `sandbox` tool
    demo_dir = f"/tmp/hermes-batch-demo-{time.monotonic_ns()}"
    create = (
        f"mkdir -p {demo_dir}\ncat > {demo_dir}/sales.csv <<'CSV'\nregion,revenue,cost\neast,120,75\n"
        "west,80,55\neast,150,90\nwest,100,70\nCSV\nprintf 'sales.csv created\\n'"
    )
    compute = (
        "import csv, json\nfrom pathlib import Path\n"
        f"work = Path('{demo_dir}')\nrows = list(csv.DictReader((work / 'sales.csv').open()))\n"
        "revenue = sum(int(r['revenue']) for r in rows)\nprofit = revenue - sum(int(r['cost']) for r in rows)\n"
        "summary = {'rows': len(rows), 'revenue': revenue, 'profit': profit}\n"
        "(work / 'summary.json').write_text(json.dumps(summary))\nprint(json.dumps(summary))"
    )
    results = tool(backend_under_test, [
        ("sandbox", {"code": create, "language": "shell", "timeout": 30}),
        ("sandbox", {"code": compute, "language": "python", "timeout": 30}),
        ("sandbox", {"code": f"cat {demo_dir}/summary.json; rm -rf {demo_dir}", "language": "shell", "timeout": 30}),
        ("sandbox", {"code": "import sys\nprint('partial out')\nsys.exit('boom')"}),
    ])
    assert [r.ok for r in results] == [True, True, True, False]
    assert results[0].content == "sales.csv created\n"
    assert json.loads(results[1].content) == {"rows": 4, "revenue": 450, "profit": 160}
    assert json.loads(results[2].content) == {"rows": 4, "revenue": 450, "profit": 160}
    assert "exit_code: 1" in results[3].content and "boom" in results[3].content and "partial out" in results[3].content


def test_session_tool_runs_the_discount_scenarios(backend_under_test):
    # the Flame article's second demo
    template = (
        "import json\nrevenues = [120, 80, 150, 100]\ncosts = [75, 55, 90, 70]\ndiscount = {d}\n"
        "if not 0 <= discount <= 1:\n    raise ValueError('discount must be between 0 and 1')\n"
        "revenue = round(sum(revenues) * (1 - discount), 2)\nprofit = round(revenue - sum(costs), 2)\n"
        "print(json.dumps({{'discount': discount, 'revenue': revenue, 'profit': profit}}))"
    )
    codes = [template.format(d=d) for d in (0.0, 0.1, 0.2, 1.2)]
    [res] = tool(backend_under_test, [("session", {"codes": codes, "language": "python", "timeout": 30})])
    assert res.ok
    out = json.loads(res.content)
    assert [o["exit_code"] for o in out] == [0, 0, 0, 1]
    assert [json.loads(o["stdout"])["revenue"] for o in out[:3]] == [450.0, 405.0, 360.0]
    assert [json.loads(o["stdout"])["profit"] for o in out[:3]] == [160.0, 115.0, 70.0]
    assert out[0] == {"exit_code": 0, "stdout": '{"discount": 0.0, "revenue": 450.0, "profit": 160.0}\n', "stderr": ""}
    assert "ValueError: discount must be between 0 and 1" in out[3]["stderr"]


def test_session_tool_validates_its_input(backend_under_test):
    results = tool(backend_under_test, [
        ("session", {"codes": []}),
        ("session", {"codes": ["print(1)"] * 65}),
        ("session", {"codes": ["print(1)"], "language": "ruby"}),
    ])
    assert not any(r.ok for r in results)
    assert all("invalid arguments for session" in r.content for r in results)


def test_a_work_tree_taken_from_one_sandbox_comes_back_whole_in_another(backend_under_test):
    """--save_workspace and recheck: what the agent left (files, a subdirectory, an executable bit, an
    empty directory) is put back the same in a fresh sandbox, over whatever was there; a tree over
    the limit is refused."""
    from hermes_batch.store.workspace import put_back, take

    but = backend_under_test

    async def main():
        backend = but.make()
        await backend.setup()
        try:
            first = await backend.start(SandboxSpec(prompt_id=f"tree-{time.monotonic_ns()}", image=but.image))
            try:
                made = await first.exec("mkdir -p sub/empty && printf 'a\\nb\\n' > sub/f.txt && "
                                        "printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod +x run.sh", timeout=30)
                archive = await take(first, 1 << 20)
                with pytest.raises(SandboxError, match="over the limit"):
                    await take(first, 16)
            finally:
                await first.close()
            second = await backend.start(SandboxSpec(prompt_id=f"back-{time.monotonic_ns()}", image=but.image))
            try:
                await second.exec("echo stale > stale.txt", timeout=30)
                await put_back(second, archive)
                seen = await second.exec("ls -A | sort | tr '\\n' ' '; echo; cat sub/f.txt; ./run.sh; "
                                         "test -d sub/empty && echo empty-dir-kept", timeout=30)
            finally:
                await second.close()
        finally:
            await backend.shutdown()
        return made, seen

    made, seen = asyncio.run(main())
    assert made.ok, made.stderr
    assert seen.stdout.splitlines() == ["run.sh sub ", "a", "b", "ran", "empty-dir-kept"], seen.stdout + seen.stderr


def _tag() -> str:
    return str(400000 + time.monotonic_ns() % 100000)


def test_background_processes_are_started_managed_and_gone_with_the_sandbox(backend_under_test):
    """`terminal(background=true)` and `process`: input sent and closed, output by lines, a wait, a
    kill, a list; the terminal's directory is theirs; what is left running ends with the sandbox."""
    tag = _tag()
    echo = "python3 -u -c \"import sys\nfor line in sys.stdin: print('got', line.strip())\nprint('eof')\""
    ticks = f"for i in 1 2 3 4 5; do echo tick $i; done; exec sleep {tag}"

    async def body(sb, backend):
        async def get():
            return sb

        ctx = ToolContext(get_sandbox=get, command_timeout=60)

        async def call(name, **args):
            res = await call_tool(TOOLS[name], json.dumps(args), ctx)
            return res.ok, json.loads(res.content) if res.content.startswith("{") else res.content

        out = [await call("terminal", command="mkdir -p sub && cd sub")]
        ok, started = await call("terminal", command=echo, background=True)
        out.append((ok, started))
        if not ok:
            return out, backend.name
        sid = started["session_id"]
        out.append(await call("process", action="submit", session_id=sid, data="hello"))
        out.append(await call("process", action="close", session_id=sid))
        out.append(await call("process", action="wait", session_id=sid, timeout=30))
        out.append(await call("terminal", command="pwd; exit 7", background=True))
        ok, server = await call("terminal", command=ticks, background=True)
        out.append((ok, server))
        for _ in range(50):  # until all five lines are written
            log = await call("process", action="log", session_id=server["session_id"], offset=1, limit=2)
            if log[1]["total_lines"] >= 5:
                break
            await asyncio.sleep(0.1)
        out.append(log)
        out.append(await call("process", action="poll", session_id=server["session_id"]))
        out.append(await call("process", action="list"))
        out.append(await call("process", action="poll", session_id="proc_nothere"))
        out.append(await call("terminal", command=f"sleep {tag}", background=True))  # left running
        return out, backend.name

    out, name = in_sandbox(backend_under_test, body)
    if name == "flame":  # each task's runner ends what its code started: said, not pretended
        assert out[1][0] is False and "background processes cannot run here" in out[1][1]["error"], out
        return
    cd, (ok, started), submit, close, waited, quick, (_, server), log, poll, listed, missing, _left = out
    # the Hermes Agent's shapes, key for key
    assert ok and list(started) == ["output", "session_id", "pid", "exit_code", "error"], started
    assert started["session_id"].startswith("proc_") and started["pid"] and started["error"] is None, started
    assert submit == (True, {"status": "ok", "bytes_written": 6}) and close == (True, {"status": "ok", "message": "input closed"})
    assert waited[1] == {"status": "exited", "command": echo, "exit_code": 0, "completion_reason": "exited",
                         "termination_source": "", "output": "got hello\neof\n"}, waited
    assert quick[0] and quick[1]["exit_code"] == 7 and quick[1]["output"].strip().endswith("/sub"), quick
    assert log[1] == {"session_id": server["session_id"], "command": ticks, "status": "running",
                      "output": "tick 2\ntick 3", "total_lines": 5, "showing": "2 lines"}, log
    assert list(poll[1]) == ["session_id", "command", "status", "pid", "uptime_seconds", "output_preview"], poll
    assert poll[1]["status"] == "running" and "tick 5" in poll[1]["output_preview"], poll
    states = {p["session_id"]: p["status"] for p in listed[1]["processes"]}
    assert states == {started["session_id"]: "exited", quick[1]["session_id"]: "exited",
                      server["session_id"]: "running"}, listed
    assert [list(p) for p in listed[1]["processes"]][-1] == ["session_id", "command", "cwd", "pid", "started_at",
                                                             "uptime_seconds", "status", "output_preview"], listed
    assert listed[1]["processes"][0]["cwd"].endswith("/sub") and listed[1]["processes"][0]["exit_code"] == 0, listed
    assert missing[0] is False and missing[1]["status"] == "not_found" and list(missing[1]) == ["status", "error"]
    if not (name == "docker" and getattr(backend_under_test.settings, "runtime", None)):  # gVisor's are not the host's
        assert not _host_processes_with(f"sleep {tag}".encode()), "a background process outlived its sandbox"


def test_a_background_process_is_killed_with_what_it_started(backend_under_test):
    tag = _tag()

    async def body(sb, backend):
        async def get():
            return sb

        ctx = ToolContext(get_sandbox=get, command_timeout=60)
        # TERM ignored (and so by its children): only the KILL that follows ends them
        res = await call_tool(TOOLS["terminal"], json.dumps({"command": f"trap '' TERM; sleep {tag} & sleep {tag}; "
                                                             "echo never", "background": True}), ctx)
        if not res.ok:
            return None, None, None
        sid = json.loads(res.content)["session_id"]
        killed = await call_tool(TOOLS["process"], json.dumps({"action": "kill", "session_id": sid}), ctx)
        left = await sb.exec(f"grep -l '[s]leep.{tag}' /proc/[0-9]*/cmdline 2>/dev/null | wc -l", timeout=30)
        listed = await call_tool(TOOLS["process"], json.dumps({"action": "list"}), ctx)
        return json.loads(killed.content), left.stdout.strip(), json.loads(listed.content)

    killed, left, listed = in_sandbox(backend_under_test, body)
    if killed is None:
        assert backend_under_test.name == "flame"
        return
    assert killed["status"] == "killed" and "never" not in killed["output"], killed
    assert left == "0", left  # both sleeps are gone
    assert [p["status"] for p in listed["processes"]] == ["exited"], listed


def _host_processes_with(needle: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in open(f"/proc/{entry}/cmdline", "rb").read():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids
