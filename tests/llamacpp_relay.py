"""A relay in front of a real llama.cpp server, on this machine's loopback: it hands every request
on unchanged and keeps each `/completion` exchange, so a test can hold what a run recorded against
what the server really returned."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import ClientSession, web


@contextmanager
def recording_relay(target: str) -> Iterator[tuple[str, list[tuple[dict[str, Any], dict[str, Any]]]]]:
    """(the relay's OpenAI base URL, the (request, answer) of every /completion so far)."""
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    ready, box = threading.Event(), {}
    loop = asyncio.new_event_loop()

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        async with ClientSession() as http, http.request(request.method, target + request.path, data=body,
                                                          headers={"Content-Type": "application/json"}) as res:
            answer = await res.read()
        if request.path == "/completion" and res.status == 200:
            seen.append((json.loads(body), json.loads(answer)))
        return web.Response(body=answer, status=res.status, content_type="application/json")

    def serve() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", relay)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "the relay did not start"
    try:
        yield box["url"], seen
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
