"""The browser's way out with `--network`: an HTTP proxy the runner serves to its sandboxes' Chromium
that reaches public addresses only, checked as the web tools' client checks them (netguard: the
host resolved here, every address it has admitted, then a connection to an address checked, so a
rebinding DNS answer cannot slip through). Chromium is pointed at it for every address (its own
loopback too where that is this machine's), so a page, a redirect or a script the model brings into
the browser reaches nothing internal through it.

It speaks what Chromium asks of a proxy: `CONNECT host:port` (https, websockets) and plain HTTP
requests in absolute form, exactly one request per connection (its body by Content-Length, then
`Connection: close` on the request and on the answer, so nothing more is sent on it). A refused
address is answered `403` with the reason (Chromium shows a plain-HTTP one as the page, a refused
CONNECT as a tunnel error). The agent's own commands can reach the proxy too: it holds at most
MAX_CONNECTIONS at once, and a connection idle for IDLE_SECONDS, or open for LIFETIME_SECONDS, ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import ada_url
import httpcore

from .netguard import Address, AddressRefused, public_addresses, public_only

HEAD_LIMIT = 64 * 1024  # bytes of a request's or an answer's head
HEAD_SECONDS = 30.0
CONNECT_SECONDS = 15.0
IDLE_SECONDS = 120.0
LIFETIME_SECONDS = 15 * 60.0
MAX_CONNECTIONS = 256  # at once, per worker
_HOP_BY_HOP = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


class GuardProxy:
    def __init__(self, host: str, allow: Callable[[Address, int], bool] = public_only):
        self.host, self.allow = host, allow
        self.server: asyncio.Server | None = None
        self.url = ""
        self.refused = 0  # requests refused (an internal address, a bad request, too many at once)
        self.open: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        """Listens on `host`, on a port of its own; the proxy's URL, as Chromium takes it."""
        self.server = await asyncio.start_server(self._serve, self.host, 0, limit=HEAD_LIMIT)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self.open):  # what is still open ends now: waiting on it could be forever
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)

    async def _serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        if len(self.open) >= MAX_CONNECTIONS:
            self.refused += 1
            with contextlib.suppress(Exception):  # its request read first: closing on unread bytes resets instead
                await asyncio.wait_for(client.read(HEAD_LIMIT), 1)
            _answer(to_client, 503, f"more than {MAX_CONNECTIONS} connections at once")
            with contextlib.suppress(Exception):
                await to_client.drain()
            to_client.close()
            return
        self.open.add(to_client)
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
            self.open.add(writer)
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
            for w in (to_client, writer):
                if w is not None:
                    self.open.discard(w)
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
    body = f"hermes-batch's browser proxy: {reason}\n".encode()
    title = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 502: "Bad Gateway",
             503: "Service Unavailable"}[status]
    with contextlib.suppress(Exception):
        writer.write(f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
