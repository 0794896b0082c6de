"""Web providers behind `web_search` / `web_extract`: one small class per service.

    firecrawl  firecrawl-py (FIRECRAWL_API_KEY): search, and its own scrape for extraction
    tavily     tavily-python (TAVILY_API_KEY): search and extract
    exa        exa-py (EXA_API_KEY): search, and its page contents for extraction
    brave      Brave Search's HTTP API (BRAVE_API_KEY): search; pages fetched here
    searxng    a SearXNG JSON endpoint (--web_base_url, or the old --web_search_url): search
    ddgs       the ddgs package, no key: search; pages fetched here

`--web_base_url` points any of them at a self-hosted or test server. A provider that has no
extraction of its own leaves it to `fetch_page` (the guarded client: public addresses only) and
`readable_text` (trafilatura). A rejected key turns the provider off for the rest of the run:
one message, not one per call.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from typing import Any, Protocol

from .base import ToolError

PROVIDERS = ("firecrawl", "tavily", "exa", "brave", "searxng", "ddgs")
KEY_VARIABLES = {"firecrawl": "FIRECRAWL_API_KEY", "tavily": "TAVILY_API_KEY", "exa": "EXA_API_KEY",
                 "brave": "BRAVE_API_KEY"}
TIMEOUT = 30.0


class KeyRejected(ToolError):
    pass


class RateLimited(ToolError):
    pass


class WebProvider(Protocol):
    name: str
    fetches_pages: bool

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        """[{title, url, snippet}]"""

    async def extract(self, url: str) -> str | None:
        """The page's readable text, or None when this provider has no extraction of its own."""


SDK_MODULES = {"firecrawl": ("firecrawl", "firecrawl-py"), "tavily": ("tavily", "tavily-python"),
               "exa": ("exa_py", "exa-py"), "ddgs": ("ddgs", "ddgs")}


def missing_package(provider: str) -> str | None:
    """The pip package a provider needs and this environment lacks, if any."""
    module, package = SDK_MODULES.get(provider, (None, None))
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError:
        return package
    return None


def key_for(provider: str) -> str | None:
    variable = KEY_VARIABLES.get(provider)
    return os.environ.get(variable) if variable else None


def choose(explicit: str | None, base_url: str | None) -> str | None:
    """The provider a run uses: the one named, else the first whose key is in the environment."""
    if explicit:
        return explicit
    if base_url:
        return "searxng"  # the old --web_search_url: a SearXNG endpoint
    return next((p for p in ("firecrawl", "tavily", "exa", "brave") if key_for(p)), None)


def _status(exc: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None) or getattr(getattr(exc, "response", None), attr, None)
        if isinstance(value, int):
            return value
    m = re.search(r"\b(401|402|403|429|5\d\d)\b", str(exc))
    return int(m.group(1)) if m else None


def translate(provider: str, exc: BaseException) -> ToolError:
    """An SDK's or the HTTP client's failure as an error the model can read."""
    if isinstance(exc, ToolError):
        return exc
    status = _status(exc)
    name = type(exc).__name__
    if status in (401, 403) or any(w in name for w in ("Unauthorized", "InvalidAPIKey", "Forbidden", "Authentication")):
        return KeyRejected(f"the {provider} web provider rejected its API key; web tools are off for this run")
    if status == 429 or any(w in name for w in ("RateLimit", "UsageLimit")):
        return RateLimited(f"the {provider} web provider is rate limiting; try again later")
    if status == 402 or "Payment" in name or "credits" in str(exc).lower():
        return ToolError(f"the {provider} web provider's quota is used up")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or "Timeout" in name:
        return ToolError(f"the {provider} web provider did not answer in time")
    return ToolError(f"the {provider} web provider failed: {name}: {str(exc)[:300]}")


class Guarded:
    """Wraps a provider: errors become tool errors; after a rejected key, no more requests."""

    def __init__(self, inner: WebProvider, on_note: Callable[[str], None] | None = None):
        self.inner, self.name, self.on_note = inner, inner.name, on_note
        self.fetches_pages = inner.fetches_pages
        self.off: str | None = None

    async def _call(self, fn: Any, *args: Any) -> Any:
        if self.off:
            raise ToolError(self.off)
        for attempt in range(2):
            try:
                return await asyncio.wait_for(fn(*args), TIMEOUT)
            except BaseException as exc:
                if isinstance(exc, asyncio.CancelledError):
                    raise
                error = translate(self.name, exc)
                if isinstance(error, KeyRejected):
                    self.off = str(error)
                    if self.on_note:
                        self.on_note(self.off)
                    raise error from None
                if attempt == 0 and isinstance(error, RateLimited):
                    await asyncio.sleep(2.0)  # one polite retry; the model reads the error after that
                    continue
                raise error from None
        raise AssertionError("the loop returns or raises")

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        return await self._call(self.inner.search, query, limit)

    async def extract(self, url: str) -> str | None:
        return await self._call(self.inner.extract, url)


# --- the providers ---------------------------------------------------------------------------------
class Searxng:
    name = "searxng"
    fetches_pages = False  # extract() fetches the page itself (else it returns None and we fetch)

    def __init__(self, base_url: str, http: Any):
        self.url, self.http = base_url, http

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        resp = await self.http.get(self.url, params={"q": query, "format": "json"})
        if resp.status_code != 200:
            raise ToolError(f"search provider answered HTTP {resp.status_code}")
        try:
            results = resp.json().get("results", [])
        except (ValueError, AttributeError):
            raise ToolError("search provider did not answer with JSON") from None
        return [{"title": r.get("title", ""), "url": r.get("url", ""), "snippet": r.get("content", "")}
                for r in results[:limit] if isinstance(r, dict)]

    async def extract(self, url: str) -> str | None:
        return None


class Brave:
    name = "brave"
    fetches_pages = False

    def __init__(self, key: str, base_url: str | None, http: Any):
        self.key, self.http = key, http
        self.url = (base_url or "https://api.search.brave.com").rstrip("/") + "/res/v1/web/search"

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        resp = await self.http.get(self.url, params={"q": query, "count": limit},
                                   headers={"X-Subscription-Token": self.key, "Accept": "application/json"})
        if resp.status_code != 200:
            raise _HttpStatus(resp.status_code)
        results = ((resp.json().get("web") or {}).get("results")) or []
        return [{"title": r.get("title", ""), "url": r.get("url", ""), "snippet": r.get("description", "")}
                for r in results[:limit]]

    async def extract(self, url: str) -> str | None:
        return None


class _HttpStatus(Exception):
    def __init__(self, status_code: int):
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class Tavily:
    name = "tavily"
    fetches_pages = True

    def __init__(self, key: str, base_url: str | None):
        from tavily import AsyncTavilyClient

        self.client = AsyncTavilyClient(api_key=key, api_base_url=base_url)

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        data = await self.client.search(query, max_results=limit)
        return [{"title": r.get("title", ""), "url": r.get("url", ""), "snippet": r.get("content", "")}
                for r in data.get("results", [])[:limit]]

    async def extract(self, url: str) -> str | None:
        data = await self.client.extract([url])
        for r in data.get("results", []):
            return r.get("raw_content") or ""
        failed = data.get("failed_results") or [{}]
        raise ToolError(f"could not extract {url}: {failed[0].get('error', 'no content')}")


class Exa:
    name = "exa"
    fetches_pages = True

    def __init__(self, key: str, base_url: str | None):
        from exa_py import AsyncExa

        self.client = AsyncExa(api_key=key, api_base=base_url or "https://api.exa.ai")

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        data = await self.client.search(query, num_results=limit, contents=False)
        return [{"title": r.title or "", "url": r.url, "snippet": getattr(r, "text", None) or ""}
                for r in data.results[:limit]]

    async def extract(self, url: str) -> str | None:
        data = await self.client.get_contents([url], text=True)
        for r in data.results:
            return r.text or ""
        raise ToolError(f"could not extract {url}: no content")


class Firecrawl:
    name = "firecrawl"
    fetches_pages = True

    def __init__(self, key: str, base_url: str | None):
        from firecrawl import AsyncFirecrawl

        self.client = AsyncFirecrawl(api_key=key, api_url=base_url or "https://api.firecrawl.dev")

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        data = await self.client.search(query, limit=limit)
        def field(r: Any, key: str) -> str:  # results come as dicts or as the SDK's models
            return (r.get(key) if isinstance(r, dict) else getattr(r, key, None)) or ""

        return [{"title": field(r, "title"), "url": field(r, "url"), "snippet": field(r, "description")}
                for r in (getattr(data, "web", None) or [])[:limit]]

    async def extract(self, url: str) -> str | None:
        doc = await self.client.scrape(url, formats=["markdown"])
        return getattr(doc, "markdown", None) or ""


class Ddgs:
    name = "ddgs"
    fetches_pages = False

    async def search(self, query: str, limit: int) -> list[dict[str, str]]:
        from ddgs import DDGS

        results = await asyncio.to_thread(lambda: DDGS().text(query, max_results=limit))
        return [{"title": r.get("title", ""), "url": r.get("href", ""), "snippet": r.get("body", "")}
                for r in results or []][:limit]

    async def extract(self, url: str) -> str | None:
        return None


def make(provider: str, base_url: str | None, http: Any, on_note: Callable[[str], None] | None = None) -> Guarded:
    """The provider a worker's web tools use (keys from the environment, as each service names them)."""
    key = key_for(provider)
    if provider in KEY_VARIABLES and not key:
        raise ToolError(f"the {provider} web provider needs {KEY_VARIABLES[provider]} in the environment")
    inner: WebProvider
    if provider == "searxng":
        if not base_url:
            raise ToolError("the searxng web provider needs --web_base_url")
        inner = Searxng(base_url, http)
    elif provider == "brave":
        inner = Brave(key or "", base_url, http)
    elif provider == "tavily":
        inner = Tavily(key or "", base_url)
    elif provider == "exa":
        inner = Exa(key or "", base_url)
    elif provider == "firecrawl":
        inner = Firecrawl(key or "", base_url)
    elif provider == "ddgs":
        inner = Ddgs()
    else:
        raise ToolError(f"unknown web provider {provider!r}")
    return Guarded(inner, on_note)


def readable_text(html: str) -> str | None:
    """The main text of a page (trafilatura), or None when it finds none."""
    try:
        import trafilatura
    except ImportError:
        return None
    return trafilatura.extract(html, include_comments=False, include_tables=True)
