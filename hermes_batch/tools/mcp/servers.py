"""MCP servers as users declare them, in the layout their MCP clients already read:

    {"mcpServers": {"name": {"command": "...", "args": [...], "env": {...}, "cwd": "..."}}}   stdio
    {"mcpServers": {"name": {"url": "https://...", "headers": {...}}}}                          streamable HTTP

in `--mcp_config=FILE`, a distribution's `[mcp_servers.<name>]` tables, a dataset row's
`mcp_servers` (the same mapping), or a Harbor task's `[[environment.mcp_servers]]` (a list whose
entries carry their `name`, and Harbor's `transport`). A server's name names its toolset and
prefixes its tools (`<name>__<tool>`)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")  # a toolset's name, and the start of an OpenAI tool name
CALL_SECONDS = 120.0  # a tool call's default bound


class McpError(ValueError):
    """A declaration that cannot be read; the message says which and where."""


class McpUnavailable(Exception):
    """A server could not be started, listed or reached; the message says why."""


class McpServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(None, min_length=1)  # stdio: run inside the prompt's sandbox
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = Field(None, min_length=1)  # streamable HTTP: reached from the runner, public addresses only
    headers: dict[str, str] = Field(default_factory=dict)
    transport: Literal["stdio", "streamable-http", "http", "sse"] | None = None  # Harbor's; implied by the rest
    timeout: float = Field(CALL_SECONDS, gt=0, le=3600)  # seconds a tool call may take

    @model_validator(mode="after")
    def _one_way(self) -> McpServer:
        if bool(self.command) == bool(self.url):
            raise ValueError("give a `command` (a stdio server, run in the prompt's sandbox) or a `url` (streamable "
                             "HTTP), not both and not neither")
        if self.transport == "sse":
            raise ValueError("the SSE transport is deprecated in MCP and not offered: serve streamable HTTP")
        if self.transport and (self.transport == "stdio") != bool(self.command):
            raise ValueError(f"transport {self.transport!r} does not match a server given by "
                             f"{'command' if self.command else 'url'}")
        return self

    @property
    def stdio(self) -> bool:
        return self.command is not None

    def fingerprint(self) -> dict[str, Any]:
        """What it is, for the run's fingerprint: a header's or a variable's value only by its hash (a key)."""
        hidden = {k: hashlib.sha256(v.encode()).hexdigest()[:12] for k, v in {**self.env, **self.headers}.items()}
        return {"command": self.command, "args": self.args, "cwd": self.cwd, "url": self.url, "timeout": self.timeout,
                "env": sorted(self.env), "headers": sorted(self.headers),
                "values": hashlib.sha256(json.dumps(hidden, sort_keys=True).encode()).hexdigest()[:12]}


def read_servers(data: Any, where: str) -> dict[str, McpServer]:
    """Servers by name from an MCP client's layout ({"mcpServers": {...}}, or the mapping itself) or
    Harbor's list of named entries; McpError naming `where` and the server otherwise."""
    if isinstance(data, dict) and set(data) == {"mcpServers"}:
        data = data["mcpServers"]
    if isinstance(data, list):  # Harbor's [[environment.mcp_servers]]
        named: dict[str, Any] = {}
        for i, entry in enumerate(data):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise McpError(f"{where}: entry {i + 1} of mcp_servers has no name")
            named[entry["name"]] = {k: v for k, v in entry.items() if k != "name"}
        data = named
    if not isinstance(data, dict):
        raise McpError(f"{where}: mcp_servers must map each server's name to {{command, args, env}} or {{url, headers}}")
    out = {}
    for name, spec in data.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise McpError(f"{where}: MCP server name {name!r} must be a letter, then up to 31 letters, digits, _ or - "
                           "(it names a toolset and prefixes its tools)")
        try:
            out[name] = McpServer.model_validate(spec)
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(map(str, first["loc"]))
            raise McpError(f"{where}: MCP server {name!r}: {at + ': ' if at else ''}"
                           f"{first['msg'].removeprefix('Value error, ')}") from None
    return out


def read_config_file(path: str) -> dict[str, McpServer]:
    """`--mcp_config`: an MCP client's JSON file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise McpError(f"--mcp_config={path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise McpError(f"--mcp_config={path}: not a JSON file ({exc})") from None
    return read_servers(data, f"--mcp_config={path}")
