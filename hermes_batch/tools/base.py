"""The Tool protocol, the context a tool runs in, and how a raw model tool call becomes a result."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import posixpath
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from ..backends.base import Sandbox, SandboxError

TERMINAL_OUTPUT_CHARS = 50_000
TOOL_OUTPUT_CHARS = 100_000


class ToolError(Exception):
    """The tool could not do what was asked; the message goes back to the model."""


@dataclass(frozen=True)
class Image:
    """An image a tool saw or made: its bytes, and their type (tools/media.py checks both)."""

    data: bytes
    mime: str

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"


@dataclass
class ToolResult:
    ok: bool
    content: str  # what the model reads, as it reads it
    structured: bool = False  # `content` is the tool's own JSON (the terminal's {exit_code, stdout, stderr})
    images: tuple[Image, ...] = ()  # what the call saw or made (kept in the run directory, named in the record)
    shown: bool = False  # the images go to the model with `content` (--vision_model=main)


def showing(images: list[Image]) -> dict[str, Any]:
    """The images of a turn's tool results as the model is shown them: a tool message holds text
    only (OpenAI's API), so they follow the results, in order, as the user's."""
    return {"role": "user", "content": [{"type": "text", "text": "The images of the tool results above, in order:"},
                                        *({"type": "image_url", "image_url": {"url": i.data_url()}} for i in images)]}


@dataclass
class ToolContext:
    """Everything a tool call may touch. One per prompt."""

    get_sandbox: Callable[[], Awaitable[Sandbox]]
    command_timeout: float = 180.0
    # what the worker opened of each toolset (toolset.py), by name: a provider, a client, a gate
    toolsets: dict[str, Any] = field(default_factory=dict)
    fetch_http: Any = None  # an httpx client for URLs the model chose: public addresses only (tools/netguard.py)
    state: dict[str, Any] = field(default_factory=dict)  # per-prompt tool state (the terminal's cwd)
    _held: list[asyncio.Semaphore] = field(default_factory=list)
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run `closer` when the prompt's agent is done (an MCP session): before its check, and at its end."""
        self._closers.append(closer)

    async def close(self) -> None:
        """The agent is done: what its tools opened for the prompt ends, each whatever the others do."""
        while self._closers:
            with contextlib.suppress(Exception):
                await self._closers.pop()()

    async def hold(self, gate: asyncio.Semaphore | None) -> None:
        """Take one place of `gate` for the rest of the prompt (once per gate)."""
        if gate is not None and gate not in self._held:
            await gate.acquire()
            self._held.append(gate)

    def release(self) -> None:
        """The prompt is over (its sandbox closed): give back what it held."""
        while self._held:
            self._held.pop().release()

    def timeout_for(self, requested: float | None) -> float:
        """A call may shorten the command timeout, and lengthen it up to 600 s or the configured value."""
        ceiling = max(self.command_timeout, 600.0)
        return min(requested, ceiling) if requested else self.command_timeout


class Tool(Protocol):
    """A tool class: what the model is told (`name`, `description`, `Args` as its JSON schema) and `run`."""

    @property
    def name(self) -> str: ...

    @property
    def toolset(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def Args(self) -> type[BaseModel]: ...  # noqa: N802 (a class, named as one)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult: ...


def _plain(node: Any) -> Any:
    """A JSON schema as the Hermes Agent writes its tools': no titles, and an optional argument as its
    own type (`{"type": "string"}`), not pydantic's `anyOf` with null and a null default."""
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _plain(v) for k, v in node.items() if k != "title"}
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options and len(options) == 2:
        del out["anyOf"]
        out = {**next(o for o in options if o != {"type": "null"}), **out}
        if out.get("default", ...) is None:
            del out["default"]
    return out


@functools.cache
def _schema_for(name: str, description: str, args_model: type[BaseModel]) -> dict[str, Any]:
    params = _plain(args_model.model_json_schema())
    params.setdefault("required", [])
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def openai_schema(tool: Tool) -> dict[str, Any]:
    """The tool's function schema for the chat-completions `tools` list (built once per tool); a tool
    whose schema comes as JSON (an MCP server's) gives its `parameters` as they are."""
    given = getattr(tool, "parameters", None)
    if isinstance(given, dict):
        return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                 "parameters": given}}
    return _schema_for(tool.name, tool.description, tool.Args)


def tool_error(message: str, **extra: Any) -> ToolResult:
    """A failed call's answer, as the Hermes Agent's tools give one: `{"error": message, ...}`."""
    return ToolResult(False, json.dumps({"error": message, **extra}, ensure_ascii=False), structured=True)


def json_result(ok: bool, payload: dict[str, Any]) -> ToolResult:
    """A result that is the tool's own JSON object (the record keeps it as a value)."""
    return ToolResult(ok, json.dumps(payload, ensure_ascii=False), structured=True)


def parse_arguments(raw: str | None) -> dict[str, Any]:
    """Model-written argument JSON → dict; an empty string means no arguments."""
    if raw is None or not raw.strip():
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


async def call_tool(tool: Tool, raw_arguments: str | None, ctx: ToolContext) -> ToolResult:
    """Run one tool call; every failure becomes a result the model can read (`{"error": ...}`, as the
    Hermes Agent answers one), never an exception. Argument JSON that does not parse is refused, never
    repaired: the model reads why, and the record keeps what it wrote."""
    try:
        args = tool.Args.model_validate(parse_arguments(raw_arguments))
    except (json.JSONDecodeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return tool_error(f"invalid arguments for {tool.name}: {problems}")
        return tool_error(f"the arguments for {tool.name} are not valid JSON: {exc}")
    try:
        return await tool.run(args, ctx)
    except ToolError as exc:
        return tool_error(str(exc))
    except FileNotFoundError as exc:
        return tool_error(str(exc))
    except SandboxError:
        raise  # the sandbox broke, not the call: the prompt fails and is retried, no junk in the data
    except Exception as exc:  # a backend hiccup in one call must not end the whole trajectory
        return tool_error(f"{tool.name} failed: {type(exc).__name__}: {exc}")


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


async def confine(ctx: ToolContext, path: str) -> tuple[Sandbox, str]:
    """Resolve a model-given path against the work directory; refuse anything that leaves it."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path is empty")
    sandbox = await ctx.get_sandbox()
    root = sandbox.workdir
    candidate = posixpath.normpath(posixpath.join(root, path))
    if not inside(candidate, root):
        raise ToolError(f"path {path!r} is outside the work directory ({root}); file tools only work inside it")
    real = await sandbox.resolve(candidate)
    if not inside(real, root):
        raise ToolError(f"path {path!r} leads outside the work directory ({root}) through a symbolic link")
    return sandbox, real
