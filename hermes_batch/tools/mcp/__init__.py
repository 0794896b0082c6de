"""MCP servers as toolsets: each server a toolset named after it (a distribution can weight it),
its tools offered as `<server>__<tool>` with the schemas the server gives.

Servers of the run (`--mcp_config`, the distribution's `[mcp_servers]`) are started once at the
run's start to list their tools (in a sandbox of the run's backend, for a stdio server), so the
tools are known, fingerprinted and refused before any model call when a server cannot be used;
each prompt then gets a session of its own on its first call of one. A row's servers (its
`mcp_servers`, a Harbor task's) are started in the prompt's sandbox before its first model call.
A call that fails, times out or finds its server gone is a tool error the model reads; a prompt's
sessions end with its agent, before its check (servers.py: the declarations; session.py: one
connection)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from ...flags import flag
from ..base import Image, ToolContext, ToolError, ToolResult
from ..media import as_image
from ..toolset import Opening, Toolset
from .servers import McpError, McpServer, McpUnavailable, read_config_file, read_servers

TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
SESSIONS = "mcp"  # ToolContext.state: a prompt's sessions, by server
ROW_SERVERS = "mcp_row"  # ToolContext.state: the row's own servers, lent as a worker lends the run's


class McpSettings(BaseModel):
    mcp_config: str | None = flag(None, "an MCP client's JSON file ({\"mcpServers\": {name: {command, args, env} | "
                                        "{url, headers}}}): each server a toolset named after it, its tools offered "
                                        "as <name>__<tool>; a stdio server runs in each prompt's sandbox "
                                        "(docs/datasets-and-tools.md)")


class McpArgs(BaseModel):
    """A call's arguments as the model gave them: the server checks them against its own schema."""

    model_config = ConfigDict(extra="allow")


class McpTool:
    """One tool of a server, as the model is told it and as the server is asked."""

    Args = McpArgs

    def __init__(self, server: str, listed: dict[str, Any]):
        self.server, self.remote = server, str(listed["name"])
        self.name = f"{server}__{TOOL_NAME.sub('_', self.remote)}"[:64]
        self.toolset = server
        self.description = str(listed.get("description") or listed.get("title") or self.remote)
        schema = listed.get("inputSchema")
        self.parameters: dict[str, Any] = dict(schema) if isinstance(schema, dict) else {"type": "object"}
        self.parameters.setdefault("type", "object")
        self.parameters.setdefault("properties", {})

    async def run(self, args: McpArgs, ctx: ToolContext) -> ToolResult:
        session = await _session(ctx, self.server)
        try:
            result = await session.call(self.remote, args.model_dump())
        except McpUnavailable as exc:
            raise ToolError(f"the MCP server {self.server}: {exc}") from None
        return _result(result)


class McpToolset(Toolset):
    """One server of the run: its tools as the start-up listing found them (`listed`)."""

    def __init__(self, name: str, server: McpServer, listed: list[dict[str, Any]] | None):
        self.name, self.server, self.listed = name, server, listed  # type: ignore[misc]
        self.tools = tuple(McpTool(name, t) for t in listed or ())  # type: ignore[misc]

    def why_not(self, config: Any) -> str | None:
        if self.server.stdio and config.backend in ("modal", "flame"):
            return f"its server runs over stdio in the prompt's sandbox, which the {config.backend} backend cannot keep open"
        if self.listed is None:
            return "its server has not been started to list its tools"
        if not self.tools:
            return "its server lists no tools"
        return None

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        return {f"mcp:{self.name}": self.server.fingerprint()} if use != "unused" else {}

    async def open(self, opening: Opening) -> Any:
        return Server(self.name, self.server, lambda headers: _fetch_client(opening, headers))


class Server:
    """What a worker lends its prompts of one server: each opens a session of its own."""

    def __init__(self, name: str, server: McpServer, fetch_client: Any):
        self.name, self.server, self.fetch_client = name, server, fetch_client


def _fetch_client(opening: Opening | None, headers: dict[str, str]) -> Any:
    """A client for a server by URL: public addresses only, as the web tools' (netguard)."""
    from ..netguard import guarded_client

    return guarded_client(timeout=30, headers={"user-agent": "hermes-batch", **headers})


def new_session(name: str, server: McpServer) -> Any:
    """A connection to `server`, not started (the `mcp` SDK, an extra, imported only here)."""
    try:
        from .session import McpSession
    except ImportError:
        raise McpUnavailable("the mcp package is not installed: pip install -e '.[mcp]'") from None
    return McpSession(name, server)


async def _session(ctx: ToolContext, server: str) -> Any:
    """The prompt's session of `server`, started on its first call (a row's, at the prompt's start),
    and afresh after a call it did not answer in time."""
    sessions: dict[str, Any] = ctx.state.setdefault(SESSIONS, {})
    if server in sessions and not sessions[server].stuck:
        return sessions[server]
    if server in sessions:  # busy with a call that timed out, perhaps for ever: a new one in its place
        await sessions.pop(server).close()
    lent = ctx.state.get(ROW_SERVERS, {}).get(server) or ctx.toolsets.get(server)
    if not isinstance(lent, Server):
        raise ToolError(f"the MCP server {server} is not offered in this run")
    try:
        session = new_session(server, lent.server)
    except McpUnavailable as exc:
        raise ToolError(f"the MCP server {server}: {exc}") from None
    sessions[server] = session
    ctx.on_close(session.close)
    try:
        await session.start(await ctx.get_sandbox() if lent.server.stdio else None, lent.fetch_client)
    except McpUnavailable as exc:
        raise ToolError(f"the MCP server {server}: {exc}") from None
    return session


async def start_row_servers(ctx: ToolContext, servers: dict[str, McpServer]) -> list[McpTool]:
    """A row's servers started in its prompt's sandbox before its first model call; their tools.
    McpUnavailable naming the server that cannot be used."""
    tools: list[McpTool] = []
    sessions: dict[str, Any] = ctx.state.setdefault(SESSIONS, {})
    lent: dict[str, Server] = ctx.state.setdefault(ROW_SERVERS, {})
    for name, server in servers.items():
        lent[name] = Server(name, server, lambda headers: _fetch_client(None, headers))
        session = new_session(name, server)
        sessions[name] = session
        ctx.on_close(session.close)
        try:
            listed = await session.start(await ctx.get_sandbox() if server.stdio else None,
                                         lambda headers: _fetch_client(None, headers))
        except McpUnavailable as exc:
            raise McpUnavailable(f"the row's MCP server {name}: {exc}") from None
        if not listed:
            raise McpUnavailable(f"the row's MCP server {name} lists no tools")
        tools += [McpTool(name, t.model_dump(mode="json")) for t in listed]
    return tools


def _result(result: Any) -> ToolResult:
    """A server's answer as the model reads it: its text, resources' text named by their URI, its
    images (kept with the record, as every tool's); an error it reports is the call's failure."""
    texts: list[str] = []
    images: list[Image] = []
    for part in result.content or []:
        kind = getattr(part, "type", "")
        if kind == "text":
            texts.append(part.text)
        elif kind == "image":
            try:
                images.append(as_image(base64.b64decode(part.data, validate=True), "the image the server returned"))
            except (ToolError, binascii.Error, ValueError) as exc:
                texts.append(f"[an image the server returned was left out: {exc}]")
        elif kind == "resource":
            inner = part.resource
            body = getattr(inner, "text", None)
            texts.append(f"[resource {inner.uri}]\n{body}" if body is not None
                         else f"[resource {inner.uri}: {getattr(inner, 'mimeType', None) or 'binary'}, not shown]")
        elif kind == "resource_link":
            texts.append(f"[resource link {part.uri}" + (f": {part.name}]" if getattr(part, "name", None) else "]"))
        else:
            texts.append(f"[{kind or 'a'} part, not shown]")
    if not texts and result.structuredContent is not None:
        texts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    content = "\n".join(texts) if texts else ("(no output)" if not images else "")
    if result.isError:  # as every failed call answers (tools/base.py tool_error)
        return ToolResult(False, json.dumps({"error": content}, ensure_ascii=False), structured=True,
                          images=tuple(images))
    return ToolResult(True, content, images=tuple(images))


__all__ = ["McpError", "McpServer", "McpSettings", "McpTool", "McpToolset", "McpUnavailable", "Server", "new_session",
           "read_config_file", "read_servers", "start_row_servers"]
