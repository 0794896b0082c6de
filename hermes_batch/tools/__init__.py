"""Tool registry: every tool by name, grouped into toolsets (the unit distributions sample)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

from .base import Tool, ToolContext, ToolError, ToolResult, call_tool, openai_schema
from .browser import BROWSER_TOOLS, DRIVER_VERSION, chromium_on_host, driver_ready
from .code import SandboxTool, SessionTool
from .files import PatchTool, ReadFileTool, SearchFilesTool, WriteFileTool
from .image_gen import KEY_VARIABLES as IMAGE_KEY_VARIABLES
from .image_gen import ImageGenerateTool
from .process import ProcessTool
from .terminal import TerminalTool
from .tts import KEY_VARIABLES as SPEECH_KEY_VARIABLES
from .tts import TextToSpeechTool
from .vision import VisionAnalyzeTool
from .web import WebExtractTool, WebSearchTool

_ALL: list[Tool] = [
    TerminalTool(), ProcessTool(),
    ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool(),
    SandboxTool(), SessionTool(),
    WebSearchTool(), WebExtractTool(),
    VisionAnalyzeTool(), ImageGenerateTool(), TextToSpeechTool(),
    *BROWSER_TOOLS,
]
TOOLS: dict[str, Tool] = {t.name: t for t in _ALL}
WEB_SETUP = ("set FIRECRAWL_API_KEY, TAVILY_API_KEY, EXA_API_KEY or BRAVE_API_KEY, or --web_provider=ddgs "
             "(no key), or --web_provider=searxng --web_base_url=URL")
TOOLSETS: dict[str, list[str]] = {}
for _t in _ALL:
    TOOLSETS.setdefault(_t.toolset, []).append(_t.name)
ALL_TOOL_NAMES: list[str] = [t.name for t in _ALL]
OPT_IN_TOOLSETS = ("tts",)  # as in the reference: offered when asked for by name, in no distribution


class Described:
    """A tool told to the model in the user's words (--tool_descriptions); it runs as itself."""

    def __init__(self, tool: Tool, description: str):
        self.tool, self.description = tool, description
        self.name, self.toolset, self.Args = tool.name, tool.toolset, tool.Args

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return await self.tool.run(args, ctx)


def tools_for(toolsets: list[str], descriptions: dict[str, str] | None = None, vision: bool = False) -> list[Tool]:
    """The tools these toolsets offer; one that needs the run's vision model (browser_vision) only with `vision`."""
    names = {n for ts in toolsets for n in TOOLSETS[ts]}
    return [Described(t, descriptions[t.name]) if descriptions and t.name in descriptions else t
            for t in _ALL if t.name in names and (vision or getattr(t, "needs", None) != "vision")]


def schema_hash(toolsets: list[str], descriptions: dict[str, str] | None = None, vision: bool = False) -> str:
    """Changes whenever the name, description or arguments of a tool these toolsets offer change
    (part of the run fingerprint: a tool added elsewhere leaves a run's resume alone)."""
    offered = tools_for([ts for ts in toolsets if ts in TOOLSETS], descriptions, vision)
    blob = json.dumps([openai_schema(t) for t in offered], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def why_not_offered(toolset: str, config: Any) -> str | None:
    """What this run lacks to offer `toolset` (None: nothing). The one home of that decision: the
    start-up checks, the plan and the fingerprint all ask here."""
    if toolset == "web" and not config.has_web_provider:
        return f"no web provider is configured ({WEB_SETUP})"
    if toolset == "vision" and not config.vision_model:
        return "no vision model is configured (--vision_model=NAME, at --vision_base_url, its key in VISION_API_KEY)"
    if toolset == "image_gen":
        if not config.image_provider:
            return "no image provider is configured (--image_provider=openai or fal)"
        if not image_key(config.image_provider, config.image_base_url):
            names = IMAGE_KEY_VARIABLES[config.image_provider][:1 if config.image_base_url else None]
            return f"--image_provider={config.image_provider} needs {' or '.join(names)}"
    if toolset == "browser":
        return _why_no_browser(config)
    if toolset == "tts":
        if config.tts_provider == "openai" and not speech_key(config.tts_base_url):
            return f"--tts_provider=openai needs {' or '.join(SPEECH_KEY_VARIABLES[:1 if config.tts_base_url else None])}"
        if config.tts_provider == "espeak" and config.backend == "local" and not shutil.which("espeak-ng"):
            return "no espeak-ng on this machine for the local sandboxes (apt-get install espeak-ng)"
    return None


BROWSER_BACKENDS = ("local", "docker", "singularity")  # those that bind the driver into a sandbox


def _why_no_browser(config: Any) -> str | None:
    if config.backend not in BROWSER_BACKENDS:
        return f"the browser runs in local, docker and singularity sandboxes, not {config.backend}'s"
    if config.backend == "local" and getattr(config.sandbox, "local_isolation", "bwrap") == "none":
        return "the browser needs the local jail (--local_isolation=bwrap): unisolated, it would reach this machine's network"
    if not driver_ready():
        return (f"its driver (agent-browser {DRIVER_VERSION}) is not installed: python -m hermes_batch.tools.browser "
                "prepare (18 MB from the npm registry, once)")
    if config.backend == "local" and not chromium_on_host():
        return "no Chromium on this machine for the local sandboxes (apt-get install chromium)"
    return None


def speech_key(base_url: str | None) -> str | None:
    """The speech endpoint's key, from the environment: OPENAI_API_KEY only for OpenAI's own endpoint."""
    names = SPEECH_KEY_VARIABLES[:1 if base_url else None]
    return next((os.environ[v] for v in names if os.environ.get(v)), None)


def image_key(provider: str, base_url: str | None) -> str | None:
    """The image provider's key, from the environment: OPENAI_API_KEY only for OpenAI's own endpoint."""
    names = IMAGE_KEY_VARIABLES[provider][:1 if base_url else None]
    return next((os.environ[v] for v in names if os.environ.get(v)), None)


__all__ = [
    "ALL_TOOL_NAMES", "OPT_IN_TOOLSETS", "TOOLS", "TOOLSETS", "WEB_SETUP", "Tool", "ToolContext", "ToolError", "ToolResult",
    "call_tool", "openai_schema", "image_key", "schema_hash", "speech_key", "tools_for", "why_not_offered",
]
