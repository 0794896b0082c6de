"""Web tools: a clear error without a provider; real HTTP against a local SearXNG-style provider."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
from aiohttp import web

from hermes_batch.tools import TOOLS, ToolContext, call_tool


async def _no_sandbox():
    raise AssertionError("web tools must not need a sandbox")


def call(name: str, args: dict, url: str | None = None):
    async def main():
        async with httpx.AsyncClient(timeout=10) as http:
            ctx = ToolContext(get_sandbox=_no_sandbox, web_search_url=url, http=http if url else None)
            return await call_tool(TOOLS[name], json.dumps(args), ctx)

    return asyncio.run(main())


def test_without_a_provider_web_tools_fail_clearly():
    for name, args in (("web_search", {"query": "flame"}), ("web_extract", {"urls": ["http://127.0.0.1/"]})):
        res = call(name, args)
        assert not res.ok and f"{name} is unavailable: no web provider is configured" in res.content
        assert "--web_search_url" in res.content


def test_search_and_extract_against_a_local_provider():
    async def search(request):
        q = request.query["q"]
        return web.json_response({"results": [
            {"title": f"About {q}", "url": f"{base}/page", "content": "snippet"},
        ]})

    async def page(request):
        return web.Response(text="<html><head><script>x()</script></head><body><h1>Title</h1><p>Body text</p></body></html>",
                            content_type="text/html")

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/search", search)
    app.router.add_get("/page", page)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        found = call("web_search", {"query": "gvisor"}, f"{base}/search")
        pages = call("web_extract", {"urls": [f"{base}/page", f"{base}/missing", "file:///etc/passwd"]}, f"{base}/search")
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
    assert found.ok and json.loads(found.content) == [{"title": "About gvisor", "url": f"{base}/page", "snippet": "snippet"}]
    out = json.loads(pages.content)
    assert pages.ok
    assert out[0]["text"] == "Title\nBody text"
    assert out[1]["error"] == "HTTP 404"
    assert "only http and https" in out[2]["error"]
