"""The browser toolset: a real Chromium in the prompt's sandbox (the local jail, Docker), driven by
the pinned agent-browser, against pages the prompt serves itself on the sandbox's own loopback."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hermes_batch.backends import SandboxSpec
from hermes_batch.tools import TOOLS, ToolContext, call_tool
from hermes_batch.tools.browser import LOAD_WAIT, SNAPSHOT_CHARS, chromium_on_host, driver_dir, driver_ready
from tests.backend_harness import REQUIRED, docker_status, make_backend_under_test, unavailable
from tests.conftest import CLI, read_jsonl, tool_results_in, write_jsonl
from tests.media_doubles import MediaDouble
from tests.scripted_model import ScriptedModel, script

BROWSER_IMAGE = os.environ.get("HERMES_BATCH_BROWSER_IMAGE", "hermes-batch-browser:bookworm")

INDEX = """<html><head><title>Shop</title></head><body><h1>Welcome</h1>
<form action="/done.html"><input aria-label="Name" name="name"><button type="submit">Send</button></form>
<a href="/about.html">About us</a> <img src="logo.png" alt="the logo" width="40" height="20">
<script>console.log("page ready"); setTimeout(() => { throw new Error("boom at load") }, 0)</script>
</body></html>"""
DONE = """<html><head><title>Done</title></head><body><p id="msg"></p>
<script>document.getElementById("msg").textContent = "Thanks " + new URLSearchParams(location.search).get("name")</script>
</body></html>"""
ABOUT = "<html><head><title>About</title></head><body><p>We sell things.</p></body></html>"
LONG = "<html><body>" + "".join(f"<p>Line number {i} of a long page</p>" for i in range(1500)) + "</body></html>"
# a form sent late (its page is busy a moment after the click, as on a loaded machine) to a page that
# comes slowly; a link to a page whose load never ends
ORDER = """<html><head><title>Order</title></head><body>
<form action="/ordered.html"><input aria-label="Item" name="item"><button type="submit">Order</button></form>
<a href="/stalled.html">Track</a>
<script>document.querySelector("button").addEventListener("click", () =>
  setTimeout(() => { const end = Date.now() + 500; while (Date.now() < end); }))</script>
</body></html>"""
ORDERED = """<html><head><title>Ordered</title></head><body><h1>Thank you</h1><!--later-->
<p>Your order ships today.</p><a href="/about.html">About us</a>
<script>addEventListener("unload", () => {})  // keeps the page out of Chromium's back-forward cache</script>
</body></html>"""
STALLED = """<html><head><title>Stalled</title></head><body><p>Nearly there</p><img src="/never.png" alt="never">
</body></html>"""
# The prompt's server: its files, never from a cache (back fetches a page again), but what a page
# has after <!--later--> comes a second after the rest, as from a slow site; /never.png never comes
SITE_SERVER = """import http.server, time

class Site(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/never.png":
            time.sleep(3600)
        super().do_GET()

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def copyfile(self, source, outputfile):
        first, later, rest = source.read().partition(b"<!--later-->")
        outputfile.write(first + later)
        if later:
            time.sleep(1)
        outputfile.write(rest)

http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Site).serve_forever()
"""


def needs_a_browser(backend: str) -> None:
    why = None if driver_ready() else "the browser driver is not prepared (python -m hermes_batch.tools.browser prepare)"
    if why is None and backend == "local" and not chromium_on_host():
        why = "no Chromium on this machine"
    if why is None and backend == "docker":
        why = docker_status() or _image_status()
    if why:
        if "chromium" in REQUIRED:
            pytest.fail(f"the browser is required here (HERMES_BATCH_REQUIRE_BACKENDS) but unavailable: {why}")
        unavailable(backend, why)


def _image_status() -> str | None:
    res = subprocess.run(["docker", "image", "inspect", BROWSER_IMAGE], capture_output=True)
    return None if res.returncode == 0 else f"{BROWSER_IMAGE} is missing (scripts/build_browser_image.sh)"


def in_browser_sandbox(backend: str, tmp_path, body, with_chromium: bool = True):
    """One sandbox that sees the driver (and, on docker, has Chromium unless `with_chromium` is
    false: the test image then); `body(sandbox, call)`."""
    needs_a_browser(backend if with_chromium else "local")  # without Chromium: the driver only
    but = make_backend_under_test(backend, tmp_path, {"driver_dir": str(driver_dir())})
    image = BROWSER_IMAGE if backend == "docker" and with_chromium else but.image

    async def main():
        be = but.make()
        await be.setup()
        sandbox = await be.start(SandboxSpec(prompt_id=f"p-{time.monotonic_ns()}", image=image))

        async def get():
            return sandbox

        ctx = ToolContext(get_sandbox=get, command_timeout=30)

        async def call(name, **args):
            res = await call_tool(TOOLS[name], json.dumps(args), ctx)
            return res.ok, (json.loads(res.content) if res.structured else res.content)

        try:
            return await body(sandbox, call)
        finally:
            await sandbox.close()
            await be.shutdown()

    return asyncio.run(main())


async def serve_site(sandbox, call) -> None:
    pages = {"index.html": INDEX, "done.html": DONE, "about.html": ABOUT, "long.html": LONG, "order.html": ORDER,
             "ordered.html": ORDERED, "stalled.html": STALLED}
    for name, page in pages.items():
        await sandbox.write_file(f"{sandbox.workdir}/site/{name}", page.encode())
    await sandbox.write_file(f"{sandbox.workdir}/serve.py", SITE_SERVER.encode())
    ok, started = await call("terminal", command="cd site && exec python3 ../serve.py", background=True)
    assert ok, started
    for _ in range(50):  # until it listens
        res = await sandbox.exec("python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/')\"",
                                 timeout=10)
        if res.exit_code == 0:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the prompt's server did not start")


def ref_of(snapshot: str, text: str) -> str:
    line = next(line for line in snapshot.splitlines() if text in line)
    return "@" + line.split("ref=", 1)[1].split("]", 1)[0].split(",")[0]


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_page_the_prompt_serves_is_read_typed_into_submitted_and_left(backend, tmp_path):
    async def body(sandbox, call):
        await serve_site(sandbox, call)
        ok, page = await call("browser_navigate", url="http://127.0.0.1:8000/")
        assert ok and page["success"] and page["title"] == "Shop", page
        snap = page["snapshot"]
        assert 'heading "Welcome"' in snap and 'textbox "Name"' in snap and 'link "About us"' in snap, snap
        ok, typed = await call("browser_type", ref=ref_of(snap, 'textbox "Name"'), text="Ada")
        assert ok, typed
        ok, _ = await call("browser_click", ref=ref_of(snap, 'button "Send"'))  # the form is submitted
        assert ok
        ok, done = await call("browser_snapshot")
        assert ok and "done.html" in done["url"] and "Thanks Ada" in done["snapshot"], done
        ok, back = await call("browser_back")
        assert ok and back["url"] == "http://127.0.0.1:8000/", back
        ok, _ = await call("browser_click", ref=ref_of(back["snapshot"], 'link "About us"'))
        ok, about = await call("browser_snapshot")
        assert ok and "We sell things." in about["snapshot"], about
        await call("browser_back")
        ok, console = await call("browser_console")
        assert ok and any("page ready" in m["text"] for m in console["messages"]), console
        assert any("boom at load" in e["text"] for e in console["errors"]), console
        ok, images = await call("browser_get_images")
        assert ok and images["images"] == [{"src": "http://127.0.0.1:8000/logo.png", "alt": "the logo",
                                            "width": 40, "height": 20}], images
        ok, value = await call("browser_console", expression="document.title + ' / ' + location.pathname")
        assert ok and value["result"] == "Shop / /", value
        assert (await call("browser_scroll", direction="down"))[0] and (await call("browser_press", key="Tab"))[0]
        ok, flag = await call("browser_navigate", url="--executable-path=/bin/sh")
        assert not ok and "is not an address" in flag["error"], flag  # a model's value is never one of the driver's flags
        ok, flag = await call("browser_press", key="--auto-connect")
        assert not ok and "is not a key" in flag["error"], flag
        ok, now = await call("browser_snapshot")
        ok, typed = await call("browser_type", ref=ref_of(now["snapshot"], 'textbox "Name"'), text="--headed -x")
        assert ok, typed
        ok, value = await call("browser_console", expression="document.querySelector('input').value")
        assert ok and value["result"] == "--headed -x", value  # typed as text, never read as the driver's flags
        ok, wrong = await call("browser_click", ref="@e999")
        assert not ok and "e999" in wrong["error"], wrong  # a stale ref is the model's to see, not a crash
        # a page longer than the bound: cut at a line, the whole text where read_file pages through it
        ok, long = await call("browser_navigate", url="http://127.0.0.1:8000/long.html")
        assert ok and long["truncated"] and len(long["snapshot"]) <= SNAPSHOT_CHARS, {k: v for k, v in long.items() if k != "snapshot"}
        whole = (await sandbox.read_file(f"{sandbox.workdir}/{long['full_snapshot_file']}", 10**7)).decode()
        assert whole.startswith(long["snapshot"] + "\n") and "Line number 1499" not in long["snapshot"]
        ok, rest = await call("read_file", path=long["full_snapshot_file"], offset=2950, limit=100)
        assert ok and "Line number 1499" in rest["content"], rest

    in_browser_sandbox(backend, tmp_path, body)


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_the_snapshot_after_a_click_enter_or_back_is_the_page_they_led_to_loaded(backend, tmp_path):
    """The page a form is sent to comes slowly, and the form goes late: the snapshot right after the
    click (or Enter) is that page, whole, at its own address (CI once had the form's page under the
    new address); back's is too. A page whose load never ends is waited for LOAD_WAIT, then read as it is."""
    ordered = "http://127.0.0.1:8000/ordered.html?item=tea"

    async def body(sandbox, call):
        await serve_site(sandbox, call)
        for send in ("click", "Enter"):
            ok, page = await call("browser_navigate", url="http://127.0.0.1:8000/order.html")
            assert ok, page
            ok, typed = await call("browser_type", ref=ref_of(page["snapshot"], 'textbox "Item"'), text="tea")
            assert ok, typed
            if send == "click":
                ok, sent = await call("browser_click", ref=ref_of(page["snapshot"], 'button "Order"'))
            else:
                ok, sent = await call("browser_press", key="Enter")
            assert ok, sent
            ok, after = await call("browser_snapshot")
            assert ok and after["url"] == ordered and 'heading "Thank you"' in after["snapshot"] \
                and "Your order ships today." in after["snapshot"], (send, after)
        ok, clicked = await call("browser_click", ref=ref_of(after["snapshot"], 'link "About us"'))
        assert ok, clicked
        ok, back = await call("browser_back")  # the slow page is fetched again
        assert ok and back["url"] == ordered and "Your order ships today." in back["snapshot"], back
        # a page whose load never ends: each call waits LOAD_WAIT for it, then reads it as it is
        ok, page = await call("browser_navigate", url="http://127.0.0.1:8000/order.html")
        assert ok, page
        started = time.monotonic()
        ok, clicked = await call("browser_click", ref=ref_of(page["snapshot"], 'link "Track"'))
        assert ok, clicked
        ok, stalled = await call("browser_snapshot")
        assert ok and "Nearly there" in stalled["snapshot"], stalled
        assert time.monotonic() - started < 2 * LOAD_WAIT + 10  # not the driver's own 24 s

    in_browser_sandbox(backend, tmp_path, body)


class _HostPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html><title>host secret</title><body>the host's own service</body></html>")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_the_browser_reaches_neither_the_internet_nor_this_machine(backend, tmp_path):
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HostPage)
    threading.Thread(target=host.serve_forever, daemon=True).start()

    async def body(sandbox, call):
        for url in ("http://1.1.1.1/", f"http://127.0.0.1:{host.server_address[1]}/", "http://169.254.169.254/"):
            ok, answer = await call("browser_navigate", url=url)
            assert not ok and "net::ERR_" in answer["error"], (url, answer)
            ok, page = await call("browser_snapshot")
            assert "host secret" not in json.dumps(page) and "host's own service" not in json.dumps(page)

    try:
        in_browser_sandbox(backend, tmp_path, body)
    finally:
        host.shutdown()


def test_no_chromium_outlives_its_sandbox(tmp_path):
    seen: dict[str, int] = {}

    async def body(sandbox, call):
        await serve_site(sandbox, call)
        assert (await call("browser_navigate", url="http://127.0.0.1:8000/"))[0]
        seen["owner"] = sandbox.owner

    in_browser_sandbox("local", tmp_path, body)

    def left() -> str:
        return subprocess.run(["ps", "-o", "pid=,comm=", "-u", str(seen["owner"])], capture_output=True, text=True).stdout

    deadline = time.monotonic() + 20  # the kernel ends a PID namespace's processes after its init, not at once
    while left().strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left().strip(), f"processes of the prompt's user outlived its sandbox:\n{left()}"


@pytest.mark.parametrize("backend", ["docker", "singularity"])
def test_a_sandbox_without_chromium_says_so(backend, tmp_path):
    async def body(sandbox, call):
        ok, answer = await call("browser_navigate", url="http://127.0.0.1:8000/")
        assert not ok and "no Chromium in this sandbox's image" in answer["error"], answer

    in_browser_sandbox(backend, tmp_path, body, with_chromium=False)


def test_an_agent_browses_through_the_runner_and_its_record_counts_the_calls_and_keeps_its_screenshot(tmp_path):
    needs_a_browser("local")
    wait = "for i in $(seq 100); do python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/')\" && exit; sleep 0.1; done"
    flow = script(
        {"calls": [["write_file", {"path": "site/index.html", "content": INDEX}],
                   ["write_file", {"path": "site/done.html", "content": DONE}]]},
        {"calls": [["terminal", {"command": "cd site && exec python3 -m http.server 8000 --bind 127.0.0.1",
                                 "background": True}]]},
        {"calls": [["terminal", {"command": wait}]]},
        {"calls": [["browser_navigate", {"url": "http://127.0.0.1:8000/"}]]},
        {"calls": [["browser_type", {"ref": "@e3", "text": "Ada"}]]},
        {"calls": [["browser_press", {"key": "Enter"}]]},
        {"calls": [["browser_snapshot", {}]]},
        {"calls": [["browser_vision", {"question": "What does the page say?", "annotate": True}]]},
        {"answer": "Submitted."},
        text="Fill in the form on your own page.")
    with ScriptedModel() as model, MediaDouble() as vision:
        cli = CLI(tmp_path, model)
        res = cli.run("browse", write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}]),
                      toolsets="terminal,file,browser", max_turns=12, vision_model="double-vision",
                      vision_base_url=f"{vision.base_url}/v1")
        offered = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert res.returncode == 0, res.stderr[-3000:]
    assert "browser_vision" in offered and "vision_analyze" not in offered, offered  # with a vision model only
    [record] = read_jsonl(cli.run_dir("browse") / "trajectories.jsonl")
    stats = record["tool_stats"]
    assert stats["browser_navigate"]["success"] == 1 and stats["browser_snapshot"]["success"] == 1, stats
    assert stats["browser_vision"]["success"] == 1, stats
    assert "browser" in record["toolsets_used"]
    tools = [t for t in tool_results_in(record)]
    assert "Thanks Ada" in tools[-2]["content"], tools[-2]["content"][:2000]
    # the screenshot the vision model was sent is kept in the run directory, named by its hash in the record
    [shot] = tools[-1]["images"]
    assert shot["mime"] == "image/png" and all(t["images"] is None for t in tools[:-1])
    data = (cli.run_dir("browse") / "images" / f"{shot['sha256']}.png").read_bytes()
    assert hashlib.sha256(data).hexdigest() == shot["sha256"] and len(data) == shot["bytes"]
    seen = json.loads(tools[-1]["content"])
    assert f"sha256={shot['sha256'][:16]}" in seen["analysis"] and "question: What does the page say?" in seen["analysis"]
    last_turn = [t for t in record["conversations"] if t["from"] == "tool"][-1]  # the text the model read it in
    assert seen["screenshot_path"] == ".browser/screenshot-1.png" and "<tool_response>" in last_turn["value"]


def test_browser_vision_is_offered_only_with_a_vision_model():
    from hermes_batch.tools import tools_for

    assert "browser_vision" not in [t.name for t in tools_for(["browser"])]
    assert "browser_vision" in [t.name for t in tools_for(["browser"], vision=True)]


def test_the_browser_is_refused_where_it_would_reach_this_machine_s_network(tmp_path):
    """A review: unisolated, the local backend's browser reached a service on the host's loopback."""
    from hermes_batch.config import RunConfig
    from hermes_batch.tools import why_not_offered

    config = RunConfig(dataset_file="d.jsonl", run_name="r", toolsets="browser", local_isolation="none")
    assert "needs the local jail" in (why_not_offered("browser", config) or "")


def test_the_browser_is_refused_before_any_model_call_without_its_driver(tmp_path):
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        env = {"XDG_CACHE_HOME": str(tmp_path / "empty-cache")}
        res = cli.run("nobrowser", write_jsonl(tmp_path / "d.jsonl", [{"prompt": "browse"}]), toolsets="browser",
                      env=env)
        assert res.returncode != 0 and "python -m hermes_batch.tools.browser prepare" in res.stderr, res.stderr[-2000:]
        assert not model.requests


def test_browsers_past_max_browsers_wait_for_a_prompt_to_end(tmp_path):
    """--max_browsers: a prompt's first browser call waits for a place; its place is given back when
    the prompt ends (here two prompts, one place: the second browses only after the first ended)."""
    needs_a_browser("local")
    but = make_backend_under_test("local", tmp_path, {"driver_dir": str(driver_dir())})

    async def main():
        be = but.make()
        await be.setup()
        boxes = [await be.start(SandboxSpec(prompt_id=f"p{i}-{time.monotonic_ns()}")) for i in range(2)]
        gate = asyncio.Semaphore(1)
        ctxs = [ToolContext(get_sandbox=lambda b=b: asyncio.sleep(0, b), command_timeout=30, toolsets={"browser": gate})
                for b in boxes]
        page = json.dumps({"url": "file:///etc/hostname"})
        try:
            first = await call_tool(TOOLS["browser_navigate"], page, ctxs[0])
            assert first.ok, first.content
            second = asyncio.ensure_future(call_tool(TOOLS["browser_navigate"], page, ctxs[1]))
            await asyncio.sleep(2)
            running = (await boxes[1].exec("ps -eo comm", timeout=30)).stdout
            assert not second.done() and "agent-browser" not in running and "chromium" not in running, \
                "a second browser started past --max_browsers=1"
            ctxs[0].release()  # the first prompt is over
            assert (await asyncio.wait_for(second, 60)).ok
        finally:
            for ctx, box in zip(ctxs, boxes, strict=True):
                await box.close()
                ctx.release()
            await be.shutdown()

    asyncio.run(main())


def test_max_browsers_is_shared_among_workers_as_the_sandboxes_are():
    from hermes_batch.config import RunConfig
    from hermes_batch.tools import Opening
    from hermes_batch.tools.browser import Browser

    def places(config: RunConfig, sandboxes: int) -> int:  # a worker's gate, as the toolset opens it
        return asyncio.run(Browser().open(Opening(config, {}, sandboxes=sandboxes)))._value

    config = RunConfig(dataset_file="d.jsonl", run_name="r", concurrency=4, max_browsers=3)
    assert places(config, 4) == 3  # one worker: all of them
    assert [places(config, 2), places(config, 2)] == [1, 1]  # two: never more than 3 in all
    assert places(config, 1) == 1 and places(RunConfig(dataset_file="d.jsonl", run_name="r"), 8) >= 1


def miniwob_rows(tmp_path, tasks: str) -> list[dict]:
    pytest.importorskip("miniwob", reason="MiniWoB++ is not installed (pip install miniwob)")
    out = tmp_path / "miniwob.jsonl"
    res = subprocess.run([sys.executable, "-m", "hermes_batch.dataset.miniwob", f"--output={out}", f"--tasks={tasks}"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return read_jsonl(out)


def test_miniwob_tasks_are_rows_whose_pages_start_by_themselves_in_the_sandbox(tmp_path):
    needs_a_browser("local")
    [row] = miniwob_rows(tmp_path, "click-button")
    assert set(row["files"]) == {"wob/miniwob/click-button.html", "wob/core/core.js", "wob/core/core.css",
                                 "wob/core/d3.v3.min.js", "wob/common/ui_utils.js"}
    url = "file:///workspace/wob/miniwob/click-button.html"
    assert url in row["prompt"] and "check" not in row  # the page scores itself where the agent can script it
    probe = ("JSON.stringify({query: document.getElementById('query').textContent, buttons: "
             "document.querySelectorAll('#area button').length, cover: "
             "getComputedStyle(document.getElementById('sync-task-cover')).display, seconds: core.EPISODE_MAX_TIME / 1000})")
    flow = script({"calls": [["browser_navigate", {"url": url}]]}, {"calls": [["terminal", {"command": "sleep 2"}]]},
                  {"calls": [["browser_console", {"expression": probe}]]}, {"answer": "{last_tool}"}, text=row["prompt"])
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("wob", write_jsonl(tmp_path / "d.jsonl", [{**row, "prompt": flow}]), toolsets="terminal,browser")
    assert res.returncode == 0, res.stderr[-3000:]
    [record] = read_jsonl(cli.run_dir("wob") / "trajectories.jsonl")
    opened, _, probed = [json.loads(t["content"]) for t in tool_results_in(record)]
    assert opened["success"] and "Click on the" in opened["snapshot"], opened  # the episode began: its instruction shows
    state = json.loads(probed["result"])
    assert state["query"].startswith("Click on the") and state["buttons"] >= 1 and state["cover"] == "none", state
    assert state["seconds"] == 3600  # an hour, not MiniWoB's ten seconds
    assert record["metadata"]["dataset"]["miniwob_task"] == "click-button"


def test_a_miniwob_task_that_does_not_exist_is_named(tmp_path):
    pytest.importorskip("miniwob", reason="MiniWoB++ is not installed (pip install miniwob)")
    res = subprocess.run([sys.executable, "-m", "hermes_batch.dataset.miniwob", f"--output={tmp_path / 'x.jsonl'}",
                          "--tasks=click-button,no-such-task"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no MiniWoB++ task named 'no-such-task'" in res.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_with_network_the_browser_reaches_public_addresses_and_nothing_internal(backend, tmp_path):
    """--network: the browser goes out through the sandbox's one way out, the runner's network guard,
    which reaches a public address (a host of the test's own at one) and refuses this machine's
    services, the metadata address, and a public page's redirect to an internal one; the prompt's
    own page, on the sandbox's own loopback, it reaches directly."""
    from tests.public_host import PUBLIC_TEXT, public_host, why_not

    needs_a_browser(backend)
    if why := why_not():
        pytest.skip(why)
    from tests.public_host import internal_address

    host = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _HostPage)  # a service of this machine, on every address
    threading.Thread(target=host.serve_forever, daemon=True).start()
    # by its loopback (the sandbox's own: nothing there) and by an address of its network (the guard refuses it)
    loopback = f"http://127.0.0.1:{host.server_address[1]}/"
    internal = f"http://{internal_address() or '10.0.0.1'}:{host.server_address[1]}/"
    try:
        with public_host() as public, ScriptedModel() as model:
            own_page = "cd site && exec python3 -m http.server 8000 --bind 127.0.0.1"
            flow = script(
                *[{"calls": [["browser_navigate", {"url": url}]]} for url in (
                    f"{public}/", internal, "http://169.254.169.254/latest/meta-data/", f"{public}/jump?to={internal}",
                    loopback)],
                {"calls": [["write_file", {"path": "site/index.html", "content": INDEX}]]},
                {"calls": [["terminal", {"command": own_page, "background": True}]]},
                {"calls": [["terminal", {"command": "sleep 1"}]]},
                {"calls": [["browser_navigate", {"url": "http://127.0.0.1:8000/"}]]},
                {"answer": "done"})
            cli = CLI(tmp_path, model)
            on = {"backend": backend, "image": BROWSER_IMAGE} if backend == "docker" else {"backend": backend}
            res = cli.run("net", write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}]),
                          toolsets="browser,terminal,file", network=True, max_turns=12, **on)
        assert res.returncode == 0, res.stderr[-3000:]
        [record] = read_jsonl(cli.run_dir("net") / "trajectories.jsonl")
        seen, own, metadata, jumped, looped, *_, served = [t["content"] for t in tool_results_in(record)]
        assert '"Shop"' in served, served  # the prompt's own page: its loopback is its own, and it goes direct
        assert PUBLIC_TEXT in json.loads(seen)["snapshot"], seen  # the public page, through the guard
        for answer in (own, metadata, jumped, looped):
            assert "host secret" not in answer and "host's own service" not in answer, answer
        for answer in (own, metadata, jumped):
            assert "internal address" in answer, answer  # the guard's refusal, shown as the page
        assert "ERR_CONNECTION_REFUSED" in looped, looped  # its own loopback, where this machine's service is not
    finally:
        host.shutdown()


def test_one_prompt_finds_no_other_prompt_s_browser(tmp_path):
    """A review, with --network on the local backend: prompt A listed the listening sockets, found
    prompt B's DevTools port on the shared loopback, read B's files through it and made B's browser
    write B's answer (B's verdict went from fail to pass). Each prompt's loopback is its own now: A,
    looking while B's browser is open, finds no port but its own way out, and no DevTools."""
    needs_a_browser("local")
    look = ("python3 - <<'EOF'\nimport json, urllib.request\nports = set()\nfor n in ('/proc/net/tcp', '/proc/net/tcp6'):\n"
            "    for line in open(n).read().splitlines()[1:]:\n        f = line.split()\n"
            "        if f[3] == '0A': ports.add(int(f[1].rsplit(':', 1)[1], 16))\n"
            "found = {}\nfor p in sorted(ports):\n    try:\n"
            "        found[p] = urllib.request.build_opener(urllib.request.ProxyHandler({})).open("
            "f'http://127.0.0.1:{p}/json/version', timeout=3).read().decode()[:200]\n"
            "    except Exception as e:\n        found[p] = f'no: {e}'\nprint(json.dumps(found))\nEOF")
    b = script({"calls": [["write_file", {"path": "secret.txt", "content": "B's own"}]]},
               {"calls": [["browser_navigate", {"url": "file:///workspace/secret.txt"}]]},
               {"calls": [["terminal", {"command": "sleep 12"}]]}, {"answer": "B"}, text="B")
    a = script({"calls": [["terminal", {"command": "sleep 8"}]]}, {"calls": [["terminal", {"command": look}]]},
               {"answer": "A"}, text="A")
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        res = cli.run("two", write_jsonl(tmp_path / "d.jsonl", [{"prompt": b}, {"prompt": a}]),
                      toolsets="browser,terminal,file", network=True, max_turns=6, concurrency=2)
    assert res.returncode == 0, res.stderr[-3000:]
    records = {next(t["value"] for t in r["conversations"] if t["from"] == "human").split("\n")[0]: r
               for r in read_jsonl(cli.run_dir("two") / "trajectories.jsonl")}
    b_tools = [t["content"] for t in tool_results_in(records["B"])]
    assert "B's own" in b_tools[1], b_tools[1]  # B's browser was open while A looked
    looked = json.loads(json.loads([t["content"] for t in tool_results_in(records["A"])][-1])["output"])
    assert list(looked) == ["3128"], looked  # its own way out, and nothing of B's
    assert not any("webSocketDebuggerUrl" in v for v in looked.values()), looked


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_no_chromium_outlives_a_runner_killed_mid_browse(backend, tmp_path):
    """kill -9 of the runner while a prompt's browser is open: its workers see it gone and end their
    sandboxes, the browser's processes with them (what a worker killed too leaves, the run's next
    start removes: each backend's sweep_orphans)."""
    needs_a_browser(backend)
    flow = script({"calls": [["write_file", {"path": "p.html", "content": "<title>held</title>open"}]]},
                  {"calls": [["browser_navigate", {"url": "file:///workspace/p.html"}]]},
                  {"calls": [["terminal", {"command": "sleep 600"}]]}, {"answer": "never"})
    on = {"backend": backend, "image": BROWSER_IMAGE} if backend == "docker" else {"backend": backend}
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": flow}])
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        proc = cli.popen("killed", data, toolsets="browser,terminal,file", **on)
        try:
            deadline = time.monotonic() + 120
            while len(model.requests) < 3:  # the third reply starts the sleep, the browser open
                assert time.monotonic() < deadline and proc.poll() is None, "the prompt never reached its sleep"
                time.sleep(0.2)
            time.sleep(1)
            held = _chromium_of(proc.pid) if backend == "local" else _containers_with_chromium()
            assert held, "no Chromium ran"
            os.kill(proc.pid, 9)  # the runner alone, as a crash would
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    deadline = time.monotonic() + 30
    left = held
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [p for p in held if _alive(p)] if backend == "local" else set(held) & _containers_with_chromium()
    assert not left, f"outlived the runner: {left}"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _chromium_of(root: int) -> list[int]:
    """The Chromium processes among `root`'s descendants."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = _children(pid)
        todo += kids
        for k in kids:
            try:
                if "chrom" in Path(f"/proc/{k}/comm").read_text():
                    found.append(k)
            except OSError:
                pass
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _containers_with_chromium() -> set[str]:
    ids = subprocess.run(["docker", "ps", "-q", "--filter", "label=hermes-batch"], capture_output=True,
                         text=True).stdout.split()
    return {c for c in ids if "chrom" in subprocess.run(["docker", "top", c, "-eo", "pid,args"], capture_output=True,
                                                          text=True).stdout}
