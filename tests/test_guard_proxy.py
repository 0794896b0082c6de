"""The browser's guard proxy (--network) over real sockets: what it forwards, how, and what it refuses.
(The browser going out through it, for real: tests/test_browser.py.)"""

from __future__ import annotations

import asyncio

from hermes_batch.tools.guard_proxy import GuardProxy


async def _upstream(seen: list[bytes]) -> asyncio.Server:
    """A server that keeps what it was sent and answers a page, or echoes through a tunnel."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        if head.startswith(b"PING"):
            writer.write(b"PONG " + head)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def _ask(proxy_url: str, request: bytes) -> bytes:
    host, port = proxy_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def test_the_guard_proxy_forwards_what_it_admits_one_request_a_connection_and_refuses_the_rest():
    async def main():
        seen: list[bytes] = []
        upstream = await _upstream(seen)
        port = upstream.sockets[0].getsockname()[1]
        # the test's upstream is on loopback: admitted by port here, as a public address would be
        proxy = GuardProxy("127.0.0.1", allow=lambda ip, p: p == port)
        url = await proxy.start()
        try:
            page = await _ask(url, f"GET http://127.0.0.1:{port}/a/b?c=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                   f"Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nX-Kept: 1\r\n\r\n".encode())
            assert page.endswith(b"hello") and page.startswith(b"HTTP/1.1 200"), page
            head = seen[-1]
            assert head.startswith(b"GET /a/b?c=1 HTTP/1.1\r\n"), head  # origin form, to the address checked
            assert b"X-Kept: 1" in head and b"Connection: close" in head
            assert b"Proxy-Authorization" not in head and b"keep-alive" not in head
            tunnel = await _ask(url, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nPING x\r\n\r\n".encode())
            assert tunnel.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nPONG PING x"), tunnel
            for refused in (f"CONNECT 127.0.0.1:{port + 1} HTTP/1.1\r\n\r\n",
                            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n",
                            "GET http://localhost:9/ HTTP/1.1\r\n\r\n"):
                answer = await _ask(url, refused.encode())
                assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"internal address" in answer, (refused, answer)
            for bad in ("GET /relative HTTP/1.1\r\n\r\n", "CONNECT nowhere HTTP/1.1\r\n\r\n",
                        "GET ftp://example.com/ HTTP/1.1\r\n\r\n", "hello\r\n\r\n"):
                answer = await _ask(url, bad.encode())
                assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403")), (bad, answer)
            assert len(seen) == 2 and proxy.refused == 7  # nothing refused reached the upstream
        finally:
            await proxy.close()
            upstream.close()

    asyncio.run(main())
