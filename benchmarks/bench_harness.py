"""What a real harness costs the runner (`--agent`): the interception endpoint's added time per model
call, and a harness's start per prompt from its cache, in the local jail.

    python benchmarks/bench_harness.py [--calls=400] [--starts=5]

- per call: one client in a loop (Python's http.client, one kept-alive connection, Chat Completions
  answered with a fixed reply by a small server of the benchmark's own on this machine's loopback)
  calls the server directly from the host, then through a prompt's interception endpoint from
  inside its jail (the endpoint answers through the run's model client, which calls that server),
  in each API the endpoint speaks: Chat Completions (Hermes), Messages (Claude Code), Responses
  (Codex), each translated to and from the run's Chat Completions call.
  The difference is what the endpoint adds to each call; the runner's CPU per call beside it.
  Goal: at most 2 ms.
- per start: the Hermes Agent driven on one prompt in a fresh jail, the fixed reply its answer:
  the time from the harness's command to its first model call, and to its end; beside them, the
  jail's bare `python3 -c pass` and `import run_agent` (what its start is made of). Goal: 1 s.

Figures are medians of what a loaded machine gives; run it on a quiet one for the README's.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fire

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_batch.backends import SandboxSpec  # noqa: E402
from hermes_batch.backends.base import HARNESS_MOUNT  # noqa: E402
from hermes_batch.config import configure  # noqa: E402
from hermes_batch.harness import Intercept, drive  # noqa: E402
from hermes_batch.runner.sandboxes import backend_session  # noqa: E402

REPLY = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}],
         "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}

# the client, the same on the host and in the jail: `calls` calls on one connection, seconds each
CLIENT = r'''import http.client, json, sys, time
host, port, key, calls, api = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
path, body = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "2+2?"}]}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "2+2?"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "2+2?"}),
}[api]
body = json.dumps(body)
headers = {"Authorization": "Bearer " + key, "x-api-key": key, "Content-Type": "application/json"}
conn = http.client.HTTPConnection(host, port, timeout=30)
times = []
for i in range(calls + 20):
    t = time.perf_counter()
    conn.request("POST", path, body, headers)
    res = conn.getresponse(); data = res.read()
    assert res.status == 200, (res.status, data[:300])
    if i >= 20:
        times.append(time.perf_counter() - t)
print(json.dumps(times))
'''


def canned_server(port_out: multiprocessing.connection.Connection) -> None:
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(REPLY)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_out.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


async def measure(calls: int, starts: int, port: int, out: Path) -> dict[str, float]:
    data = out / "d.jsonl"
    data.write_text(json.dumps({"prompt": "What is 2+2?"}) + "\n")
    config = configure({"dataset_file": str(data), "run_name": "bench", "output_dir": str(out), "model": "m",
                        "api_key": "k", "base_url": f"http://127.0.0.1:{port}/v1", "agent": "hermes",
                        "toolsets": ["terminal"], "require_reasoning": False, "sandbox_root": str(out / "sb")})
    from hermes_batch.llm import open_client
    from hermes_batch.util.limits import AdaptiveLimit

    llm = open_client(config.model_settings(), "k", AdaptiveLimit(8))
    intercept = Intercept(llm, 10 * calls, "m")
    figures: dict[str, float] = {}
    direct = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, "127.0.0.1", str(port), "k", str(calls),
                                                  "chat", stdout=asyncio.subprocess.PIPE)
    figures["direct call, ms"] = median_ms(json.loads((await direct.communicate())[0]))
    async with backend_session(config) as backend:
        box = await backend.start(SandboxSpec(prompt_id="bench-calls"))
        try:
            for api in ("chat", "messages", "responses"):  # what Hermes, Claude Code and Codex speak
                line = await intercept.open(box)
                before = cpu()
                res = await box.exec(shlex.join(["python3", "-c", CLIENT, "127.0.0.1", "4000", line.key, str(calls),
                                                 api]), timeout=600)
                spent = cpu() - before
                assert res.exit_code == 0, res.stderr[-2000:]
                through = median_ms(json.loads(res.stdout))
                figures[f"{api}: through the endpoint, ms"] = through
                figures[f"{api}: added per call, ms"] = through - figures["direct call, ms"]
                figures[f"{api}: runner CPU per call, ms"] = spent / (calls + 20) * 1000
                await line.close()
        finally:
            await box.close()
        firsts, wholes, bare, imports = [], [], [], []
        for i in range(starts):
            box = await backend.start(SandboxSpec(prompt_id=f"bench-start-{i}"))
            try:
                t = time.perf_counter()
                await box.exec("python3 -c pass", timeout=60)
                bare.append(time.perf_counter() - t)
                t = time.perf_counter()
                done = await box.exec("python3 -c 'import run_agent'", timeout=120, env={"PYTHONPATH": HARNESS_MOUNT})
                imports.append(time.perf_counter() - t)
                assert done.exit_code == 0, done.stderr[-2000:]
                line = await intercept.open(box)
                first: list[float] = []
                answer = line.answer

                async def timed(body: dict, answer=answer, first=first) -> object:
                    first.append(time.perf_counter())
                    return await answer(body)

                line.answer = timed  # type: ignore[method-assign,assignment]
                t = time.perf_counter()
                done, _ = await drive(config.harness, line, box, prompt="What is 2+2?", task_id=f"s{i}", model="m",
                                      toolsets=["terminal"], max_calls=4, timeout=300)
                wholes.append(time.perf_counter() - t)
                assert first, f"the harness never called its model: {done.stderr[-2000:]}"
                firsts.append(first[0] - t)
                await line.close()
            finally:
                await box.close()
        figures["jail python3 -c pass, s"] = statistics.median(bare)
        figures["jail import run_agent, s"] = statistics.median(imports)
        figures["hermes start to first call, s"] = statistics.median(firsts)
        figures["hermes whole prompt (one call), s"] = statistics.median(wholes)
    await llm.close()
    return figures


def main(calls: int = 400, starts: int = 5) -> None:
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=canned_server, args=(send,), daemon=True)
    server.start()
    try:
        port = receive.recv()
        with tempfile.TemporaryDirectory(prefix="hb-bench-harness-") as tmp:
            os.chmod(tmp, 0o755)
            figures = asyncio.run(measure(calls, starts, port, Path(tmp)))
    finally:
        server.kill()
        server.join()
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:8.3f}")
    for api in ("chat", "messages", "responses"):
        print(f"{f'{api}: added / goal (2 ms)':<{width}}  {figures[f'{api}: added per call, ms'] / 2:8.2f}")
    print(f"{'start: to first call / goal (1 s)':<{width}}  {figures['hermes start to first call, s'] / 1:8.2f}")


if __name__ == "__main__":
    fire.Fire(main)
