"""One prompt's connection to one MCP server, through the `mcp` SDK's client session.

A stdio server runs inside the prompt's sandbox, as the agent's commands run (`Sandbox.spawn`):
its stdout's lines are the messages it sends, its stdin takes ours. A server by URL is reached from
the runner over streamable HTTP, by a client that connects to public addresses only (netguard). A
task of its own owns the SDK's session (its cancel scopes are entered and left in one task); calls
come from the prompt's tool calls, each bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

import anyio
from mcp import ClientSession
from mcp.shared.exceptions import McpError as ProtocolError
from mcp.shared.message import SessionMessage
from mcp.types import CallToolResult, JSONRPCMessage, Tool
from pydantic import ValidationError

from ...backends.base import Process, Sandbox, SandboxError
from .servers import McpServer, McpUnavailable

START_SECONDS = 60.0  # for a server to start and list its tools
TIMED_OUT = 408  # the code the SDK gives a request whose answer did not come within its read timeout


class McpSession:
    def __init__(self, name: str, server: McpServer):
        self.name, self.server = name, server
        self.process: Process | None = None
        self.session: ClientSession | None = None
        self._listed: asyncio.Future[list[Tool]] | None = None
        self._stop = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self.stuck = False  # a call went unanswered: it may be busy with it still (the next call starts it afresh)

    async def start(self, sandbox: Sandbox | None, fetch_client: Any = None) -> list[Tool]:
        """Started (stdio: in `sandbox`), initialised; its tools. McpUnavailable saying why not."""
        loop = asyncio.get_running_loop()
        self._listed = loop.create_future()
        if self.server.stdio:
            if sandbox is None:
                raise McpUnavailable("a stdio server runs in the prompt's sandbox, and there is none")
            try:
                self.process = await sandbox.spawn([self.server.command or "", *self.server.args], cwd=self.server.cwd,
                                                   env=self.server.env)
            except SandboxError as exc:
                raise McpUnavailable(f"it could not be started: {exc}") from None
        self._owner = asyncio.ensure_future(self._own(fetch_client))
        try:
            return await asyncio.wait_for(asyncio.shield(self._listed), START_SECONDS)
        except TimeoutError:
            await self.close()
            raise McpUnavailable(f"it did not start and list its tools within {START_SECONDS:g} s{self._said()}") from None
        except McpUnavailable:
            await self.close()
            raise

    async def call(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        if self.session is None or self._owner is None or self._owner.done():
            raise McpUnavailable(f"the server is not running{self._said()}")
        timeout = datetime.timedelta(seconds=self.server.timeout)
        try:
            return await asyncio.wait_for(self.session.call_tool(tool, arguments, read_timeout_seconds=timeout),
                                          self.server.timeout + 5)
        except TimeoutError:
            self.stuck = True
            raise McpUnavailable(f"{tool} did not answer within {self.server.timeout:g} s") from None
        except ProtocolError as exc:  # its answer was an error of the protocol's, or none came in time
            if exc.error.code == TIMED_OUT:
                self.stuck = True
                raise McpUnavailable(f"{tool} did not answer within {self.server.timeout:g} s (it is started afresh "
                                     "for the next call)") from None
            raise McpUnavailable(f"{tool}: {exc.error.message}{self._said()}") from None

    async def close(self) -> None:
        self._stop.set()
        if self._owner is not None:  # (asyncio.wait: neither its failure nor its cancellation is the caller's)
            done, _ = await asyncio.wait({self._owner}, timeout=5)
            if not done:
                self._owner.cancel()
                await asyncio.wait({self._owner}, timeout=5)
        if self._listed is not None and self._listed.done() and not self._listed.cancelled():
            self._listed.exception()  # a failure no caller waits for any more is not one to warn of
        if self.process is not None:
            await self.process.close()

    def _said(self) -> str:
        tail = self.process.stderr_tail().strip() if self.process is not None else ""
        return f"; it said: {tail[-600:]}" if tail else ""

    async def _own(self, fetch_client: Any) -> None:
        """The session's life: opened, listed, then held until `close`."""
        assert self._listed is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.process is not None:
                    read, write = await stack.enter_async_context(_over_stdio(self.process))
                else:
                    from mcp.client.streamable_http import streamable_http_client

                    client = fetch_client(self.server.headers)
                    await stack.enter_async_context(client)
                    read, write, _ = await stack.enter_async_context(
                        streamable_http_client(self.server.url or "", http_client=client))
                self.session = await stack.enter_async_context(ClientSession(read, write))
                await self.session.initialize()
                tools: list[Tool] = []
                cursor = None
                while True:
                    page = await self.session.list_tools(cursor=cursor) if cursor else await self.session.list_tools()
                    tools += page.tools
                    cursor = page.nextCursor
                    if not cursor:
                        break
                if not self._listed.done():
                    self._listed.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - whatever ended it is what a caller is told
            if not self._listed.done():
                why = _reason(exc)
                self._listed.set_exception(McpUnavailable(f"{why}{self._said()}"))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.session = None


def _reason(exc: BaseException) -> str:
    """A failure as a sentence, through the exception groups anyio raises."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, asyncio.CancelledError):
        return "it was stopped"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


@contextlib.asynccontextmanager
async def _over_stdio(process: Process):  # noqa: ANN201 - an async context manager of two streams
    """The SDK's two streams over a sandbox process: its stdout's lines in, our messages to its stdin."""
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reading() -> None:
        async with read_send:
            while line := await process.stdout.readline():
                if not line.strip():
                    continue
                try:
                    message = JSONRPCMessage.model_validate_json(line)
                except ValidationError as exc:  # a line of its own logging: the session is told, and goes on
                    await read_send.send(exc)
                    continue
                await read_send.send(SessionMessage(message))

    async def writing() -> None:
        async with write_recv:
            async for sent in write_recv:
                process.write(sent.message.model_dump_json(by_alias=True, exclude_none=True).encode() + b"\n")
                await process.drain()

    async with anyio.create_task_group() as group:
        group.start_soon(reading)
        group.start_soon(writing)
        try:
            yield read_recv, write_send
        finally:
            group.cancel_scope.cancel()
