"""Web tools: a clear error without a provider; real HTTP against a local SearXNG-style provider."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
from aiohttp import web

from hermes_batch.tools import TOOLS, ToolContext, call_tool, providers
from hermes_batch.tools.netguard import guarded_client, public_only


async def _no_sandbox():
    raise AssertionError("web tools must not need a sandbox")


def call(name: str, args: dict, url: str | None = None, allow=public_only):
    async def main():
        async with httpx.AsyncClient(timeout=10) as http, guarded_client(allow, timeout=10) as fetch:
            provider = providers.make("searxng", url, http) if url else None
            ctx = ToolContext(get_sandbox=_no_sandbox, toolsets={"web": provider}, fetch_http=fetch if url else None)
            return await call_tool(TOOLS[name], json.dumps(args), ctx)

    return asyncio.run(main())


def only_port(port: int):
    """The test's stand-in for "a public address": this one loopback port, nothing else."""
    return lambda ip, p: ip.is_loopback and p == port


class Site:
    """An aiohttp app on 127.0.0.1 in a thread; `hits` counts the requests it saw."""

    def __init__(self, routes: dict):
        self.hits = 0
        self.loop = asyncio.new_event_loop()
        app = web.Application()

        def counted(handler):
            async def h(request):
                self.hits += 1
                return await handler(request)
            return h

        for path, handler in routes.items():
            app.router.add_get(path, counted(handler))
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_without_a_provider_web_tools_fail_clearly():
    for name, args in (("web_search", {"query": "flame"}), ("web_extract", {"urls": ["http://127.0.0.1/"]})):
        res = call(name, args)
        assert not res.ok and f"{name} is unavailable: no web provider is configured" in res.content


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
        port = int(base.rsplit(":", 1)[1])
        pages = call("web_extract", {"urls": [f"{base}/page", f"{base}/missing", "file:///etc/passwd"]}, f"{base}/search",
                     allow=only_port(port))
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
    assert found.ok and json.loads(found.content) == [{"title": "About gvisor", "url": f"{base}/page", "snippet": "snippet"}]
    out = json.loads(pages.content)
    assert pages.ok
    assert out[0]["text"] == "Title\nBody text"
    assert out[1]["error"] == "HTTP 404"
    assert "only http and https" in out[2]["error"]


def test_web_extract_refuses_internal_addresses_before_connecting():
    internal = Site({"/v1/models": lambda r: _json({"data": ["secret-model"]})})
    try:
        urls = [f"{internal.base}/v1/models", f"http://localhost:{internal.port}/v1/models",
                "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://[::1]/",
                "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/"]
        res = call("web_extract", {"urls": urls[:5]}, "http://search.invalid/")
        res2 = call("web_extract", {"urls": urls[5:]}, "http://search.invalid/")
    finally:
        internal.close()
    out = json.loads(res.content) + json.loads(res2.content)
    assert not res.ok and not res2.ok
    assert all("internal address" in page["error"] for page in out), out
    assert internal.hits == 0 and "secret-model" not in res.content


def test_web_extract_refuses_a_redirect_to_an_internal_address():
    internal = Site({"/admin": lambda r: _json({"token": "internal-only"})})
    public = Site({"/go": lambda r: _redirect(f"{internal.base}/admin")})
    try:
        res = call("web_extract", {"urls": [f"{public.base}/go"]}, "http://search.invalid/", allow=only_port(public.port))
    finally:
        public.close()
        internal.close()
    assert public.hits == 1 and internal.hits == 0
    assert "internal address" in json.loads(res.content)[0]["error"] and "internal-only" not in res.content


def test_web_extract_reads_a_huge_page_only_up_to_its_cap():
    from hermes_batch.tools.web import MAX_PAGE_BYTES

    async def huge(request):
        resp = web.StreamResponse(headers={"content-type": "text/html"})
        await resp.prepare(request)
        chunk = b"<p>" + b"x" * (1 << 20) + b"</p>"
        try:
            for _ in range(50):  # 50 MB, unless the reader stops early
                await resp.write(chunk)
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    site = Site({"/huge": huge})
    try:
        res = call("web_extract", {"urls": [f"{site.base}/huge"]}, "http://search.invalid/", allow=only_port(site.port))
    finally:
        site.close()
    page = json.loads(res.content)[0]
    assert res.ok and f"[page cut at {MAX_PAGE_BYTES} bytes]" in page["text"]


async def _json(data):
    return web.json_response(data)


async def _redirect(location):
    raise web.HTTPFound(location)
