"""The tools, by toolset: the unit distributions sample. Each toolset is a plug-in (toolset.py)
declaring its tools, its flags, what it needs and how it opens; adding one is a module of this
folder and a line in `REGISTRY`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .base import Tool, ToolContext, ToolError, ToolResult, call_tool, openai_schema
from .browser import Browser
from .code import Code
from .files import Files
from .image_gen import ImageGen
from .mcp import McpSettings, McpToolset
from .terminal import Terminal
from .toolset import Opening, Toolset, close_all
from .tts import Tts
from .vision import Vision
from .web import SETUP as WEB_SETUP
from .web import Web

# the order tools are offered in (and hashed: tool_schema)
REGISTRY: dict[str, Toolset] = {t.name: t for t in (Terminal(), Files(), Code(), Web(), Vision(), ImageGen(), Tts(),
                                                    Browser())}
_ALL: list[Tool] = [tool for toolset in REGISTRY.values() for tool in toolset.tools]
TOOLS: dict[str, Tool] = {t.name: t for t in _ALL}
TOOLSETS: dict[str, list[str]] = {name: [t.name for t in toolset.tools] for name, toolset in REGISTRY.items()}
ALL_TOOL_NAMES: list[str] = [t.name for t in _ALL]
OPT_IN_TOOLSETS = tuple(name for name, toolset in REGISTRY.items() if toolset.opt_in)
# the toolsets' flags: bases of RunConfig, so the CLI shows them flat and each toolset reads its own
SETTINGS = (*(toolset.Settings for toolset in REGISTRY.values() if toolset.Settings is not None), McpSettings)


class Described:
    """A tool told to the model in the user's words (--tool_descriptions); it runs as itself."""

    def __init__(self, tool: Tool, description: str):
        self.tool, self.description = tool, description
        self.name, self.toolset, self.Args = tool.name, tool.toolset, tool.Args

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return await self.tool.run(args, ctx)


def tools_for(toolsets: list[str], descriptions: dict[str, str] | None = None, vision: bool = False,
              plugins: dict[str, Toolset] | None = None) -> list[Tool]:
    """The tools these toolsets offer, in the registry's order, then the run's other toolsets' (its
    MCP servers', `plugins`); one that needs the run's vision model (browser_vision) only with `vision`."""
    plugins = plugins or REGISTRY
    wanted = set(toolsets)
    every = [t for name, ts in plugins.items() if name in wanted for t in ts.tools]
    return [Described(t, descriptions[t.name]) if descriptions and t.name in descriptions else t
            for t in every if vision or getattr(t, "needs", None) != "vision"]


def schema_hash(toolsets: list[str], descriptions: dict[str, str] | None = None, vision: bool = False,
                plugins: dict[str, Toolset] | None = None) -> str:
    """Changes whenever the name, description or arguments of a tool these toolsets offer change
    (part of the run fingerprint: a tool added elsewhere leaves a run's resume alone)."""
    offered = tools_for(toolsets, descriptions, vision, plugins)
    blob = json.dumps([openai_schema(t) for t in offered], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def why_not_offered(toolset: str, config: Any) -> str | None:
    """What this run lacks to offer `toolset` (None: nothing): the toolset's own answer. The start-up
    checks, the plan and the fingerprint all ask here."""
    return REGISTRY[toolset].why_not(config)


__all__ = [
    "ALL_TOOL_NAMES", "OPT_IN_TOOLSETS", "REGISTRY", "SETTINGS", "McpToolset", "TOOLS", "TOOLSETS", "WEB_SETUP", "Opening", "Tool",
    "ToolContext", "ToolError", "ToolResult", "Toolset", "call_tool", "close_all", "openai_schema", "schema_hash",
    "tools_for", "why_not_offered",
]
