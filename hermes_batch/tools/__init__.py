"""The tools, by toolset: the unit distributions sample. Each toolset is a plug-in (toolset.py)
declaring its tools, its flags, what it needs and how it opens; adding one is a module of this
folder and a line in `REGISTRY`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, model_validator

from ..flags import flag
from ..util import read_json_flag
from .base import Tool, ToolContext, ToolError, ToolResult, call_tool, json_result, openai_schema, tool_error
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


class ToolSettings(BaseModel):
    """What every tool is told: its commands' time, and the words it is described in."""

    command_timeout: float = flag(180.0, "seconds per command", gt=0, le=3600)
    tool_descriptions: str | None = flag(None, "a JSON file {tool name: description}: the model is told these "
                                               "instead of the tools' own (the names and arguments stay)")
    tool_description_texts: dict[str, str] | None = None  # read from tool_descriptions; not a flag

    @model_validator(mode="after")
    def _load_tool_descriptions(self) -> ToolSettings:
        if self.tool_descriptions and self.tool_description_texts is None:
            data = read_json_flag("tool_descriptions", self.tool_descriptions)
            if not isinstance(data, dict) or not all(isinstance(v, str) and v.strip() for v in data.values()):
                raise ValueError(f"--tool_descriptions={self.tool_descriptions} must hold a JSON object "
                                 "{tool name: description}, each description a non-empty string")
            if unknown := sorted(set(data) - set(TOOLS)):
                raise ValueError(f"--tool_descriptions={self.tool_descriptions} names no such tool: {', '.join(unknown)} "
                                 f"(tools: {', '.join(TOOLS)})")
            object.__setattr__(self, "tool_description_texts", data)
        return self


# the tools' flags, then each toolset's: slices of RunConfig (the CLI shows them flat; each reads its own)
SETTINGS: tuple[type[BaseModel], ...] = (ToolSettings, *(t.Settings for t in REGISTRY.values() if t.Settings is not None),
            McpSettings)


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
    "ToolContext", "ToolError", "ToolResult", "ToolSettings", "Toolset", "call_tool", "close_all", "json_result",
    "openai_schema", "schema_hash", "tool_error", "tools_for", "why_not_offered",
]
