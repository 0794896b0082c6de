"""An MCP server for the tests, written with the `mcp` SDK's FastMCP. A row gives it to its sandbox
as a file and declares it (`python3 server.py`, over stdio); `--http HOST PORT` serves it over
streamable HTTP instead (a host of the tests' own at a public address)."""

from __future__ import annotations

import base64
import json
import os
import sys
import time

from mcp.server.fastmcp import FastMCP, Image

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
server = FastMCP("fixture")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def write_note(path: str, text: str) -> str:
    """Write a text into a file of the current directory."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return f"wrote {len(text)} characters to {path} in {os.getcwd()}"


@server.tool()
def slow(seconds: float) -> str:
    """Wait, then answer."""
    time.sleep(seconds)
    return "done waiting"


@server.tool()
def broken() -> str:
    """Always fails."""
    raise ValueError("this tool always fails")


@server.tool()
def picture() -> Image:
    """A picture of one pixel."""
    return Image(data=PNG, format="png")


@server.tool()
def whoami() -> str:
    """Where the server runs: its process, directory and environment's names."""
    return json.dumps({"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "env": sorted(os.environ)})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        from mcp.server.transport_security import TransportSecuritySettings

        server.settings.host, server.settings.port = sys.argv[2], int(sys.argv[3])
        # reached by its address, as a public server is: the SDK's default admits loopback names only
        server.settings.transport_security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        server.run("streamable-http")
    else:
        server.run()
