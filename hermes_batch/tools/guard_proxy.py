"""The network guard: the one way out of a sandbox given `--network` (backends/egress.py places
its listening socket inside each sandbox's own network, on the sandbox's loopback). An HTTP proxy
that reaches public addresses only, checked as the web tools' client checks them (netguard: the
host resolved here, every address it has admitted, then a connection to an address checked, so a
rebinding DNS answer cannot slip through), for the agent's commands (through the proxy variables)
and the browser (Chromium is pointed at it for everything but the sandbox's own loopback) alike, so
a command, a page, a redirect or a script the model brings reaches nothing internal through it.

It speaks what HTTP clients ask of a proxy: `CONNECT host:port` (https, websockets, git, pip) and
plain HTTP requests in absolute form, exactly one request per connection (its body by
Content-Length, then `Connection: close` on the request and on the answer, so nothing more is sent
on it). A refused address is answered `403` with the reason (Chromium shows a plain-HTTP one as the
page, a refused CONNECT as a tunnel error). A sandbox holds at most MAX_PER_SANDBOX connections at
once and a worker's sandboxes MAX_CONNECTIONS together; a connection idle for IDLE_SECONDS, or open
for LIFETIME_SECONDS, ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from collections.abc import Awaitable, Callable

import ada_url
import httpcore

from .netguard import Address, AddressRefused, public_addresses, public_only

HEAD_LIMIT = 64 * 1024  # bytes of a request's or an answer's head
HEAD_SECONDS = 30.0
CONNECT_SECONDS = 15.0
IDLE_SECONDS = 120.0
LIFETIME_SECONDS = 15 * 60.0
MAX_CONNECTIONS = 1024  # at once, per worker (each holds two descriptors)
MAX_PER_SANDBOX = 64  # at once, per sandbox: one prompt's idle connections cannot take the others' turn
_HOP_BY_HOP = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


class GuardProxy:
    def __init__(self, allow: Callable[[Address, int], bool] = public_only):
        self.allow = allow
        self.refused = 0  # requests refused (an internal address, a bad request, too many at once)
        self.clients: dict[str, set[asyncio.StreamWriter]] = {}  # each sandbox's connections to the guard
        self.upstream: dict[str, set[asyncio.StreamWriter]] = {}  # and the guard's onwards, for them
        self._stops: dict[int, Callable[[], Awaitable[None]]] = {}

    async def serve(self, listener: socket.socket, sandbox: str) -> Callable[[], Awaitable[None]]:
        """Serves connections to `listener`, a listening socket in `sandbox`'s own network (Egress)."""
        server = await asyncio.start_server(functools.partial(self._serve, sandbox), sock=listener, limit=HEAD_LIMIT)
        self.clients.setdefault(sandbox, set())
        self.upstream.setdefault(sandbox, set())

        async def stop() -> None:
            self._stops.pop(id(server), None)
            server.close()
            for writer in [*self.clients.pop(sandbox, ()), *self.upstream.pop(sandbox, ())]:
                writer.transport.abort()  # what is still open ends now: waiting on it could be forever
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

        self._stops[id(server)] = stop
        return stop

    @property
    def open(self) -> int:
        return sum(len(c) for c in self.clients.values())

    async def close(self) -> None:
        for stop in list(self._stops.values()):
            await stop()

    async def _serve(self, sandbox: str, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        mine = self.clients.get(sandbox)
        if mine is None:  # the sandbox is being closed
            to_client.transport.abort()
            return
        if len(mine) >= MAX_PER_SANDBOX or self.open >= MAX_CONNECTIONS:
            self.refused += 1
            with contextlib.suppress(Exception):  # its request read first: closing on unread bytes resets instead
                await asyncio.wait_for(client.read(HEAD_LIMIT), 1)
            cap = (f"more than {MAX_PER_SANDBOX} connections at once from this sandbox" if len(mine) >= MAX_PER_SANDBOX
                   else f"more than {MAX_CONNECTIONS} connections at once")
            _answer(to_client, 503, cap)
            with contextlib.suppress(Exception):
                await to_client.drain()
            to_client.close()
            return
        mine.add(to_client)
        onwards = self.upstream.setdefault(sandbox, set())
        writer: asyncio.StreamWriter | None = None
        try:
            try:
                head = await asyncio.wait_for(client.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
            except TimeoutError:
                _answer(to_client, 408, "the request's head did not come in time")
                return
            method, target, version, headers = _parse(head)
            if method == b"CONNECT":
                host, port = _authority(target.decode("latin-1"))
            else:
                host, port, path = _absolute(target.decode("latin-1"))
            upstream, writer = await self._connect(host, port)
            onwards.add(writer)
            ends = time.monotonic() + LIFETIME_SECONDS
            if method == b"CONNECT":
                to_client.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await asyncio.gather(_pipe(client, writer, ends), _pipe(upstream, to_client, ends))
                return
            length = _body_length(headers)
            kept = [h for h in headers if h.split(b":", 1)[0].strip().lower() not in _HOP_BY_HOP]
            writer.write(b"\r\n".join([method + b" " + path.encode("latin-1") + b" " + version,
                                       *kept, b"Connection: close", b"", b""]))
            if length:  # the one request's body, and nothing after it
                writer.write(await asyncio.wait_for(client.readexactly(length), IDLE_SECONDS))
            await _relay_answer(upstream, to_client, ends)
        except (AddressRefused, _Refused) as exc:
            self.refused += 1
            _answer(to_client, 403, str(exc))
        except (httpcore.ConnectError, OSError, TimeoutError, OverflowError) as exc:
            _answer(to_client, 502, f"could not reach it: {type(exc).__name__}: {exc}")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.refused += 1
            _answer(to_client, 400, "not a request this proxy serves")
        finally:
            mine.discard(to_client)
            if writer is not None:
                onwards.discard(writer)
            for w in (to_client, writer):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        failure: Exception | None = None
        for address in await public_addresses(host, port, self.allow):  # the resolver's order of preference
            try:
                return await asyncio.wait_for(asyncio.open_connection(str(address), port, limit=HEAD_LIMIT),
                                              CONNECT_SECONDS)
            except (OSError, TimeoutError) as exc:
                failure = exc
        assert failure is not None
        raise failure


class _Refused(Exception):
    pass


def _parse(head: bytes) -> tuple[bytes, bytes, bytes, list[bytes]]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refused("not an HTTP/1 request")
    return parts[0].upper(), parts[1], parts[2], lines[1:]


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise _Refused(f"{text!r} is not a port")
    return int(text)


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host:
        raise _Refused(f"CONNECT needs host:port, not {target!r}")
    return host.strip("[]"), _port(port)


def _absolute(target: str) -> tuple[str, int, str]:
    """(host, port, the request's target in origin form) of a plain-HTTP proxy request."""
    try:
        url = ada_url.URL(target)
    except ValueError:
        raise _Refused(f"{target!r} is not an absolute http URL") from None
    if url.protocol != "http:":
        raise _Refused(f"only http requests go through in the clear, not {url.protocol}")
    return url.hostname.strip("[]"), _port(url.port) if url.port else 80, (url.pathname or "/") + url.search


def _body_length(headers: list[bytes]) -> int:
    length = 0
    for h in headers:
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            raise _Refused("a request body of unknown length (chunked): send its Content-Length")
        if name == b"content-length":
            if not value.strip().isdigit():
                raise _Refused("a Content-Length that is not a number")
            length = int(value.strip())
    return length


async def _relay_answer(upstream: asyncio.StreamReader, to_client: asyncio.StreamWriter, ends: float) -> None:
    """The answer, its head saying the connection closes after it (so the browser sends nothing more on it)."""
    head = await asyncio.wait_for(upstream.readuntil(b"\r\n\r\n"), IDLE_SECONDS)
    lines = head[:-4].split(b"\r\n")
    kept = [lines[0], *(h for h in lines[1:] if h.split(b":", 1)[0].strip().lower() not in _HOP_BY_HOP)]
    to_client.write(b"\r\n".join([*kept, b"Connection: close", b"", b""]))
    await _pipe(upstream, to_client, ends)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, ends: float) -> None:
    try:
        while True:
            left = ends - time.monotonic()
            if left <= 0:
                break
            data = await asyncio.wait_for(source.read(65536), min(IDLE_SECONDS, left))
            if not data:
                break
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError, TimeoutError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if sink.can_write_eof():
                sink.write_eof()


def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"hermes-batch's network guard: {reason}\n".encode()
    title = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 502: "Bad Gateway",
             503: "Service Unavailable"}[status]
    with contextlib.suppress(Exception):
        writer.write(f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
