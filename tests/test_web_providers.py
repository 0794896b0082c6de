"""Each web provider through its real SDK (or HTTP API) against a loopback double that speaks the
service's documented API: request shape, auth header, response shape, and what a 401 and a 429
turn into. The real services are opt-in (HERMES_BATCH_WEB_REAL=1 and the provider's key)."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from aiohttp import web

from hermes_batch.tools import TOOLS, ToolContext, call_tool, providers
from hermes_batch.tools.netguard import guarded_client
from tests.test_web_tools import Site, only_port

KEY = "test-key-123"


class Double:
    """One loopback server for every provider's API; `mode` makes it answer 401 or 429."""

    def __init__(self):
        self.mode = "ok"
        self.seen: list[tuple[str, dict, dict]] = []  # (path, headers, body or query)
        routes = {
            ("POST", "/search"): self.tavily_or_exa_search, ("POST", "/extract"): self.tavily_extract,
            ("POST", "/contents"): self.exa_contents, ("POST", "/v2/search"): self.firecrawl_search,
            ("POST", "/v2/scrape"): self.firecrawl_scrape, ("GET", "/res/v1/web/search"): self.brave_search,
        }
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        for (method, path), handler in routes.items():
            app.router.add_route(method, path, self._wrap(handler))
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        import threading

        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def _wrap(self, handler):
        async def h(request):
            body = await request.json() if request.method == "POST" else dict(request.query)
            self.seen.append((request.path, dict(request.headers), body))
            if self.mode == "401":
                return web.json_response({"error": "Unauthorized: invalid API key", "message": "Invalid API key"},
                                         status=401)
            if self.mode == "429":
                return web.json_response({"error": "Rate limit exceeded", "message": "Too many requests"}, status=429)
            return await handler(request, body)
        return h

    async def tavily_or_exa_search(self, request, body):
        if "x-api-key" in request.headers:  # Exa
            return web.json_response({"requestId": "r1", "resolvedSearchType": "neural", "results": [
                {"id": "https://exa.example/a", "url": "https://exa.example/a", "title": f"Exa on {body['query']}",
                 "score": 0.5, "publishedDate": None, "author": None}]})
        return web.json_response({"query": body["query"], "answer": None, "images": [], "response_time": 0.1,
                                  "results": [{"title": f"Tavily on {body['query']}", "url": "https://tavily.example/a",
                                               "content": "tavily snippet", "score": 0.9, "raw_content": None}]})

    async def tavily_extract(self, request, body):
        return web.json_response({"results": [{"url": u, "raw_content": f"tavily text of {u}"} for u in body["urls"]],
                                  "failed_results": [], "response_time": 0.1})

    async def exa_contents(self, request, body):
        urls = body.get("urls") or body.get("ids") or []
        return web.json_response({"requestId": "r2", "results": [
            {"id": u, "url": u, "title": "Exa page", "text": f"exa text of {u}"} for u in urls]})

    async def firecrawl_search(self, request, body):
        return web.json_response({"success": True, "data": {"web": [
            {"title": f"Firecrawl on {body['query']}", "url": "https://fc.example/a", "description": "fc snippet"}]}})

    async def firecrawl_scrape(self, request, body):
        return web.json_response({"success": True, "data": {
            "markdown": f"# firecrawl text of {body['url']}", "metadata": {"sourceURL": body["url"], "statusCode": 200}}})

    async def brave_search(self, request, body):
        return web.json_response({"type": "search", "web": {"type": "search", "results": [
            {"title": f"Brave on {body['q']}", "url": "https://brave.example/a", "description": "brave snippet"}]}})

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def double():
    d = Double()
    yield d
    d.close()


def run_tools(provider_name: str, base_url: str | None, calls: list[tuple[str, dict]], allow=None):
    async def main():
        async with httpx.AsyncClient(timeout=10) as http, guarded_client(allow or (lambda ip, p: False), timeout=10) as fetch:
            provider = providers.make(provider_name, base_url, http)
            ctx = ToolContext(get_sandbox=None, toolsets={"web": provider}, fetch_http=fetch)  # type: ignore[arg-type]
            return [await call_tool(TOOLS[name], json.dumps(args), ctx) for name, args in calls]
    return asyncio.run(main())


SDK_PROVIDERS = {
    # name: (the auth header and its value, the search path, the extraction path)
    "tavily": (("Authorization", f"Bearer {KEY}"), "/search", "/extract"),
    "exa": (("x-api-key", KEY), "/search", "/contents"),
    "firecrawl": (("Authorization", f"Bearer {KEY}"), "/v2/search", "/v2/scrape"),
}


@pytest.mark.parametrize("name", sorted(SDK_PROVIDERS))
def test_an_sdk_provider_searches_and_extracts_through_its_documented_api(name, double, monkeypatch):
    monkeypatch.setenv(providers.KEY_VARIABLES[name], KEY)
    double.mode, double.seen = "ok", []
    (header, value), search_path, extract_path = SDK_PROVIDERS[name]
    found, pages = run_tools(name, double.base, [("web_search", {"query": "gvisor"}),
                                                 ("web_extract", {"urls": ["https://docs.example/x"]})])
    assert found.ok, found.content
    hits = json.loads(found.content)
    assert hits[0]["title"].endswith("on gvisor") and hits[0]["url"].startswith("https://")
    assert pages.ok, pages.content
    assert "text of https://docs.example/x" in json.loads(pages.content)[0]["text"]
    paths = [p for p, _, _ in double.seen]
    assert paths == [search_path, extract_path]
    for _, headers, _ in double.seen:
        assert headers.get(header) == value  # the key, as the service expects it
    assert "gvisor" in json.dumps(double.seen[0][2])


@pytest.mark.parametrize("name", [*sorted(SDK_PROVIDERS), "brave"])
def test_a_rejected_key_turns_the_provider_off_with_one_message(name, double, monkeypatch):
    monkeypatch.setenv(providers.KEY_VARIABLES[name], KEY)
    double.mode, double.seen = "401", []
    notes: list[str] = []

    async def main():
        async with httpx.AsyncClient(timeout=10) as http:
            provider = providers.make(name, double.base, http, on_note=notes.append)
            ctx = ToolContext(get_sandbox=None, toolsets={"web": provider}, fetch_http=http)  # type: ignore[arg-type]
            return [await call_tool(TOOLS["web_search"], json.dumps({"query": f"q{i}"}), ctx) for i in range(3)]

    results = asyncio.run(main())
    assert all(not r.ok and f"the {name} web provider rejected its API key" in r.content for r in results)
    assert len(double.seen) == 1  # after the first 401, no more requests
    assert notes == [f"the {name} web provider rejected its API key; web tools are off for this run"]


@pytest.mark.parametrize("name", [*sorted(SDK_PROVIDERS), "brave"])
def test_a_rate_limit_is_retried_once_then_a_tool_error_the_model_reads(name, double, monkeypatch):
    monkeypatch.setenv(providers.KEY_VARIABLES[name], KEY)
    double.mode, double.seen = "429", []
    [res] = run_tools(name, double.base, [("web_search", {"query": "x"})])
    assert not res.ok and f"the {name} web provider is rate limiting" in res.content
    assert len(double.seen) == 2


def test_brave_search_and_a_guarded_fetch_for_its_pages(double, monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", KEY)
    double.mode, double.seen = "ok", []
    page = Site({"/article": lambda r: _html("<html><body><nav>menu</nav><article><h1>Gvisor</h1>"
                                              "<p>gVisor is an application kernel that implements a Linux-like "
                                              "interface, written in a memory-safe language.</p></article>"
                                              "<footer>footer links</footer></body></html>")})
    try:
        found, pages = run_tools("brave", double.base, [("web_search", {"query": "gvisor"}),
                                                        ("web_extract", {"urls": [f"{page.base}/article"]})],
                                 allow=only_port(page.port))
    finally:
        page.close()
    assert json.loads(found.content) == [{"title": "Brave on gvisor", "url": "https://brave.example/a",
                                          "snippet": "brave snippet"}]
    path, headers, query = double.seen[0]
    assert path == "/res/v1/web/search" and headers["X-Subscription-Token"] == KEY and query == {"q": "gvisor", "count": "8"}
    text = json.loads(pages.content)[0]["text"]
    assert "application kernel" in text and "footer links" not in text  # the main text, not the page chrome


def test_ddgs_needs_no_key_and_maps_its_results(monkeypatch):
    from ddgs.ddgs import DDGS  # the real class (the package's DDGS is a lazy proxy to it)

    asked = []

    def fake_text(self, query, max_results=None, **kw):  # the SDK boundary: DuckDuckGo is not reachable here
        asked.append((query, max_results))
        return [{"title": "DDG result", "href": "https://ddg.example/a", "body": "ddg snippet"}]

    monkeypatch.setattr(DDGS, "text", fake_text)
    [found] = run_tools("ddgs", None, [("web_search", {"query": "gvisor"})])
    assert json.loads(found.content) == [{"title": "DDG result", "url": "https://ddg.example/a", "snippet": "ddg snippet"}]
    assert asked == [("gvisor", 8)]


def test_a_provider_that_fetches_pages_itself_is_not_handed_internal_addresses(double, monkeypatch):
    monkeypatch.setenv("TAVILY_API_KEY", KEY)
    double.mode, double.seen = "ok", []
    [pages] = run_tools("tavily", double.base, [("web_extract", {"urls": [
        "http://127.0.0.1:8080/admin", "http://169.254.169.254/latest/meta-data/", "http://localhost/"]})])
    out = json.loads(pages.content)
    assert all("internal address" in p["error"] for p in out), out
    assert not double.seen  # the provider was never asked


def test_internal_addresses_are_refused_as_the_provider_s_fetcher_would_read_them(double, monkeypatch):
    """Node and Chromium (WHATWG URLs) read a trailing dot, a backslash and numeric hosts as the
    address they name; every such form was handed over before."""
    monkeypatch.setenv("TAVILY_API_KEY", KEY)
    double.mode, double.seen = "ok", []
    urls = ["http://127.0.0.1./", "http://169.254.169.254./latest", "http://127.0.0.1:8080\\@example.com/",
            "http://0x7f.1/", "http://2130706433/", "http://localhost./", "http://LOCALHOST/", "http://router/",
            "http://metadata.google.internal/", "http://[::ffff:127.0.0.1]/", "http://%31%32%37.0.0.1/"]
    calls = [("web_extract", {"urls": urls[i:i + 5]}) for i in range(0, len(urls), 5)]  # 5 a call at most
    out = [page for res in run_tools("tavily", double.base, calls) for page in json.loads(res.content)]
    assert len(out) == len(urls) and all("internal address" in p["error"] for p in out), out
    assert not double.seen  # the provider was never asked


def test_a_public_url_is_handed_over_in_the_form_that_was_checked(double, monkeypatch):
    monkeypatch.setenv("TAVILY_API_KEY", KEY)
    double.mode, double.seen = "ok", []
    [pages] = run_tools("tavily", double.base, [("web_extract", {"urls": ["HTTPS://Docs.Example.ORG/a b"]})])
    assert "error" not in json.loads(pages.content)[0], pages.content
    assert "https://docs.example.org/a%20b" in json.dumps(double.seen)


def test_the_provider_is_chosen_by_flag_else_by_the_first_key_present(monkeypatch):
    for variable in providers.KEY_VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    assert providers.choose(None, None) is None
    monkeypatch.setenv("BRAVE_API_KEY", "b")
    monkeypatch.setenv("EXA_API_KEY", "e")
    assert providers.choose(None, None) == "exa"  # firecrawl, tavily, exa, brave: the first present
    assert providers.choose("ddgs", None) == "ddgs"
    assert providers.choose(None, "http://searx.local/search") == "searxng"  # the old --web_search_url


REAL = {name: providers.KEY_VARIABLES[name] for name in ("firecrawl", "tavily", "exa", "brave")}


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_real_service(name):
    if os.environ.get("HERMES_BATCH_WEB_REAL") != "1" or not os.environ.get(REAL[name]):
        pytest.skip(f"the real {name} service is not configured here: set HERMES_BATCH_WEB_REAL=1 and {REAL[name]}")
    found, pages = run_tools(name, None, [("web_search", {"query": "gVisor application kernel"}),
                                          ("web_extract", {"urls": ["https://gvisor.dev/docs/"]})],
                             allow=lambda ip, p: ip.is_global)
    assert found.ok and json.loads(found.content), found.content
    assert pages.ok and "gVisor" in json.loads(pages.content)[0]["text"], pages.content


async def _html(text):
    return web.Response(text=text, content_type="text/html")


def test_a_run_uses_the_provider_end_to_end_and_says_a_rejected_key_once(double, tmp_path):
    from tests.conftest import CLI, read_jsonl, write_jsonl
    from tests.scripted_model import ScriptedModel, script

    rows = [{"prompt": script({"calls": [["web_search", {"query": f"topic {i}"}]]}, {"answer": "ok"}, text=f"Find {i}.")}
            for i in range(4)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    env = {"TAVILY_API_KEY": KEY}
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        double.mode = "ok"
        res = cli.run("web-ok", data, toolsets="web", web_provider="tavily", web_base_url=double.base, env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "web tools: tavily" in res.stderr
        records = read_jsonl(cli.run_dir("web-ok") / "trajectories.jsonl")
        assert all("Tavily on topic" in r["conversations"][3]["value"] for r in records)
        double.mode = "401"
        res = cli.run("web-401", data, toolsets="web", web_provider="tavily", web_base_url=double.base, env=env,
                      num_workers=1)
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stderr.count("the tavily web provider rejected its API key") == 1
        res = cli.run("web-nokey", data, toolsets="web", web_provider="tavily", env={"TAVILY_API_KEY": ""})
        assert res.returncode == 1 and "--web_provider=tavily needs TAVILY_API_KEY" in res.stderr


def test_a_provider_whose_package_is_missing_is_named_before_anything_runs(tmp_path):
    """Run with a Python path where importing tavily fails: the run names the package to install."""
    from tests.conftest import CLI, write_jsonl
    from tests.scripted_model import ScriptedModel

    blocker = tmp_path / "blocked"
    (blocker / "tavily").mkdir(parents=True)
    (blocker / "tavily" / "__init__.py").write_text("raise ImportError('tavily is not installed here')\n")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    with ScriptedModel() as model:
        res = CLI(tmp_path, model).run("nopkg", data, toolsets="web", web_provider="tavily",
                                       env={"TAVILY_API_KEY": KEY, "PYTHONPATH": str(blocker)})
        assert res.returncode == 1, res.stderr[-2000:]
        assert "--web_provider=tavily needs the tavily-python package: pip install -e '.[web]'" in res.stderr
        assert not model.requests
