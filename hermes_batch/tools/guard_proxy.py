"""The browser's way out with `--network`: an HTTP proxy the runner serves to its sandboxes' Chromium
that reaches public addresses only, checked as the web tools' client checks them (netguard: the
host resolved here, every address it has admitted, then a connection to the very address checked,
so a rebinding DNS answer cannot slip through). Chromium is pointed at it for every address (its
own loopback too where that is this machine's), so a page, a redirect or a script the model
brings into the browser reaches nothing internal through it.

It speaks what Chromium asks of a proxy: `CONNECT host:port` (https, websockets) and plain HTTP
requests in absolute form, one request per connection (`Connection: close` both ways). A refused
address is answered `403` with the reason, which the browser shows the model as the page.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import ada_url
import httpcore

from .netguard import Address, AddressRefused, public_address, public_only

HEAD_LIMIT = 64 * 1024  # bytes of a request's head
HEAD_SECONDS = 30.0
CONNECT_SECONDS = 15.0
_HOP_BY_HOP = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


class GuardProxy:
    def __init__(self, host: str, allow: Callable[[Address, int], bool] = public_only):
        self.host, self.allow = host, allow
        self.server: asyncio.Server | None = None
        self.url = ""
        self.refused = 0  # requests refused (an internal address, a bad request)

    async def start(self) -> str:
        """Listens on `host`, on a port of its own; the proxy's URL, as Chromium takes it."""
        self.server = await asyncio.start_server(self._serve, self.host, 0, limit=HEAD_LIMIT)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()

    async def _serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            head = await asyncio.wait_for(client.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
            method, target, version, headers = _parse(head)
            if method == b"CONNECT":
                host, port = _authority(target.decode("latin-1"))
                path = ""
            else:
                host, port, path = _absolute(target.decode("latin-1"))
            address = await public_address(host, port, self.allow)
            upstream, writer = await asyncio.wait_for(asyncio.open_connection(str(address), port), CONNECT_SECONDS)
            upstream_writer = writer
            if method == b"CONNECT":
                to_client.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:  # one request per connection: a second one could name another host
                kept = [h for h in headers if h.split(b":", 1)[0].strip().lower() not in _HOP_BY_HOP]
                writer.write(b"\r\n".join([method + b" " + path.encode("latin-1") + b" " + version,
                                           *kept, b"Connection: close", b"", b""]))
            await asyncio.gather(_pipe(client, writer), _pipe(upstream, to_client))
        except (AddressRefused, _Refused) as exc:
            self.refused += 1
            _answer(to_client, 403, str(exc))
        except (httpcore.ConnectError, OSError, TimeoutError) as exc:
            _answer(to_client, 502, f"could not reach it: {type(exc).__name__}: {exc}")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.refused += 1
            _answer(to_client, 400, "not a request this proxy serves")
        finally:
            for w in (to_client, upstream_writer):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()


class _Refused(Exception):
    pass


def _parse(head: bytes) -> tuple[bytes, bytes, bytes, list[bytes]]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refused("not an HTTP/1 request")
    return parts[0].upper(), parts[1], parts[2], lines[1:]


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise _Refused(f"CONNECT needs host:port, not {target!r}")
    return host.strip("[]"), int(port)


def _absolute(target: str) -> tuple[str, int, str]:
    """(host, port, the request's target in origin form) of a plain-HTTP proxy request."""
    try:
        url = ada_url.URL(target)
    except ValueError:
        raise _Refused(f"{target!r} is not an absolute http URL") from None
    if url.protocol != "http:":
        raise _Refused(f"only http requests go through in the clear, not {url.protocol}")
    port = int(url.port) if url.port else 80
    return url.hostname.strip("[]"), port, (url.pathname or "/") + url.search


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if sink.can_write_eof():
                sink.write_eof()


def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"hermes-batch's browser proxy: {reason}\n".encode()
    title = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    with contextlib.suppress(Exception):
        writer.write(f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
