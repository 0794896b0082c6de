"""Tool registry: every tool by name, grouped into toolsets (the unit distributions sample)."""

from __future__ import annotations

import hashlib
import json

from .base import Tool, ToolContext, ToolError, ToolResult, call_tool, openai_schema
from .code import SandboxTool, SessionTool
from .files import PatchTool, ReadFileTool, SearchFilesTool, WriteFileTool
from .terminal import TerminalTool
from .web import WebExtractTool, WebSearchTool

_ALL: list[Tool] = [
    TerminalTool(),
    ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool(),
    SandboxTool(), SessionTool(),
    WebSearchTool(), WebExtractTool(),
]
TOOLS: dict[str, Tool] = {t.name: t for t in _ALL}
TOOLSETS: dict[str, list[str]] = {}
for _t in _ALL:
    TOOLSETS.setdefault(_t.toolset, []).append(_t.name)
ALL_TOOL_NAMES: list[str] = [t.name for t in _ALL]


def tools_for(toolsets: list[str]) -> list[Tool]:
    names = {n for ts in toolsets for n in TOOLSETS[ts]}
    return [t for t in _ALL if t.name in names]


def schema_hash() -> str:
    """Changes whenever a tool's name, description or arguments change (part of the run fingerprint)."""
    blob = json.dumps([openai_schema(t) for t in _ALL], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


__all__ = [
    "ALL_TOOL_NAMES", "TOOLS", "TOOLSETS", "Tool", "ToolContext", "ToolError", "ToolResult",
    "call_tool", "openai_schema", "schema_hash", "tools_for",
]
