"""The `web` toolset: `web_search` and `web_extract` over the run's web provider (providers.py).
Without a provider the run does not offer them at all; a tool called anyway fails clearly."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from ..errors import UserError
from ..flags import flag
from ..util import clip
from .base import TOOL_OUTPUT_CHARS, ToolContext, ToolError, ToolResult
from .netguard import AddressRefused, refuse_internal
from .providers import KEY_VARIABLES, KeyRejected, choose, key_for, make, missing_package, readable_text
from .toolset import Opening, Toolset

NO_PROVIDER = "{tool} is unavailable: no web provider is configured for this run"
MAX_RESULTS = 8
MAX_URLS = 5
MAX_PAGE_BYTES = 2 * 1024 * 1024  # read no more of a page than this (a 50 MB page once held 525 MB)


SETUP = ("set FIRECRAWL_API_KEY, TAVILY_API_KEY, EXA_API_KEY or BRAVE_API_KEY, or --web_provider=ddgs "
         "(no key), or --web_provider=searxng --web_base_url=URL")


def _provider(ctx: ToolContext, tool: str) -> Any:
    provider = ctx.toolsets.get("web")
    if provider is None or (tool == "web_extract" and ctx.fetch_http is None):
        raise ToolError(NO_PROVIDER.format(tool=tool))
    return provider


class WebSearchArgs(BaseModel):
    query: str = Field(min_length=1, description="What to search the web for.")


class WebSearchTool:
    name = "web_search"
    toolset = "web"
    description = "Search the web. Returns a JSON list of {title, url, snippet}."
    Args = WebSearchArgs

    async def run(self, args: WebSearchArgs, ctx: ToolContext) -> ToolResult:
        hits = await _provider(ctx, self.name).search(args.query, MAX_RESULTS)
        return ToolResult(True, json.dumps(hits, ensure_ascii=False), structured=True)


class WebExtractArgs(BaseModel):
    urls: list[str] = Field(min_length=1, max_length=MAX_URLS, description=f"1-{MAX_URLS} http(s) URLs to fetch.")


class WebExtractTool:
    name = "web_extract"
    toolset = "web"
    description = "Fetch web pages and return their readable text, as a JSON list of {url, text} or {url, error}."
    Args = WebExtractArgs

    async def run(self, args: WebExtractArgs, ctx: ToolContext) -> ToolResult:
        provider = _provider(ctx, self.name)
        pages = []
        for url in args.urls:
            if not re.match(r"https?://", url, re.I):
                pages.append({"url": url, "error": "only http and https URLs can be fetched"})
                continue
            try:
                text = await self._one(provider, ctx, url)
            except KeyRejected:
                raise  # the provider is off for the run: one error for the call, not one per URL
            except (AddressRefused, ToolError) as exc:
                pages.append({"url": url, "error": str(exc)})
                continue
            except Exception as exc:
                pages.append({"url": url, "error": f"{type(exc).__name__}: {exc}"})
                continue
            pages.append({"url": url, "text": clip(text, TOOL_OUTPUT_CHARS // len(args.urls))})
        ok = any("text" in p for p in pages)
        return ToolResult(ok, json.dumps(pages, ensure_ascii=False), structured=True)

    @staticmethod
    async def _one(provider: Any, ctx: ToolContext, url: str) -> str:
        if provider.fetches_pages:  # it may be self-hosted inside this network: no internal pages
            url = await refuse_internal(url)
        text = await provider.extract(url)
        if text is not None:
            return text
        page = await _fetch(ctx.fetch_http, url)  # the provider has no extraction: fetch it here, guarded
        if isinstance(page, int):
            raise ToolError(f"HTTP {page}")
        body, is_html, cut = page
        # a big page takes a while to parse: not on the event loop the other agent loops share
        text = await asyncio.to_thread(_main_text, body) if is_html else body
        return text + (f"\n[page cut at {MAX_PAGE_BYTES} bytes]" if cut else "")


def _main_text(html: str) -> str:
    return readable_text(html) or html_to_text(html)


async def _fetch(http, url: str) -> int | tuple[str, bool, bool]:
    """The page's text (at most MAX_PAGE_BYTES of it), or its HTTP status when that is not 200."""
    async with http.stream("GET", url, follow_redirects=True) as resp:
        if resp.status_code != 200:
            return resp.status_code
        data = bytearray()
        async for chunk in resp.aiter_bytes():
            data += chunk
            if len(data) > MAX_PAGE_BYTES:
                break
        cut = len(data) > MAX_PAGE_BYTES
        text = bytes(data[:MAX_PAGE_BYTES]).decode(resp.encoding or "utf-8", errors="replace")
        return text, "html" in resp.headers.get("content-type", ""), cut


class _TextOnly(HTMLParser):
    SKIP = {"script", "style", "noscript", "head"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1
        elif tag in {"p", "div", "br", "li", "h1", "h2", "h3", "tr"}:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _TextOnly()
    parser.feed(html)
    text = "".join(parser.parts)
    return re.sub(r"\n\s*\n+", "\n\n", re.sub(r"[ \t]+", " ", text)).strip()


class WebSettings(BaseModel):
    web_provider: Literal["firecrawl", "tavily", "exa", "brave", "searxng", "ddgs"] | None = flag(
        None, "the web tools' provider (default: the first whose key is in the environment)")
    web_base_url: str | None = flag(None, "point the web provider at a self-hosted or test server (searxng: required)")
    web_search_url: str | None = flag(None, "the old spelling of --web_provider=searxng --web_base_url=URL")

    @model_validator(mode="after")
    def _old_web_flag(self) -> WebSettings:
        if self.web_search_url and not self.web_base_url:  # the old spelling keeps working
            object.__setattr__(self, "web_base_url", self.web_search_url)
            if self.web_provider is None:
                object.__setattr__(self, "web_provider", "searxng")
        if self.web_provider == "searxng" and not self.web_base_url:
            raise ValueError("--web_provider=searxng needs --web_base_url (your SearXNG's /search URL)")
        return self

    @property
    def web_provider_name(self) -> str | None:
        """The web tools' provider in this run: the one named, else the first whose key is set."""
        return choose(self.web_provider, self.web_base_url)

    @property
    def has_web_provider(self) -> bool:
        return self.web_provider_name is not None


class Web(Toolset):
    name = "web"
    tools = (WebSearchTool(), WebExtractTool())
    Settings = WebSettings

    def why_not(self, config: Any) -> str | None:
        return None if config.has_web_provider else f"no web provider is configured ({SETUP})"

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        # the same distribution, other tools offered (as runs always had it)
        return {"web_tools": "left out: no provider"} if use == "left_out" else {}

    def keys(self, config: Any) -> dict[str, str]:
        provider = config.web_provider_name
        key = key_for(provider) if provider in KEY_VARIABLES else None
        return {"web": key} if key else {}  # (the provider reads it where it runs: providers.make)

    def at_start(self, config: Any, say: Callable[[str], None]) -> None:
        provider = config.web_provider_name
        if provider in KEY_VARIABLES and not key_for(provider):
            raise UserError(f"--web_provider={provider} needs {KEY_VARIABLES[provider]} in the environment")
        if provider and (package := missing_package(provider)):
            raise UserError(f"--web_provider={provider} needs the {package} package: pip install -e '.[web]'")
        if config.has_web_provider and (config.toolsets is None or "web" in config.toolsets):
            say(f"web tools: {provider}" + ("" if config.web_provider else " (its key is in the environment)"))

    async def open(self, opening: Opening) -> Any:
        config = opening.config
        return make(config.web_provider_name, config.web_base_url, opening.http, on_note=opening.note)

