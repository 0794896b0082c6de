"""The network guard (--network) over real sockets: what it forwards, how, and what it refuses.
(Sandboxes and the browser going out through it, for real: tests/test_egress.py, tests/test_browser.py.)"""

from __future__ import annotations

import asyncio
import socket

from hermes_batch.tools.guard_proxy import GuardProxy


async def _listen(proxy: GuardProxy, sandbox: str = "s") -> str:
    """The guard served on a socket of the test's own (a sandbox's is placed in its network)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    await proxy.serve(listener, sandbox)
    return f"http://127.0.0.1:{port}"


async def _upstream(seen: list[bytes]) -> asyncio.Server:
    """A server that keeps what it was sent and answers a page, or echoes through a tunnel."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"POST"):
            head += await reader.readexactly(4)
        seen.append(head)
        if head.startswith(b"PING"):
            writer.write(b"PONG " + head)
        else:  # as a server that keeps connections open would answer
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello")
        await writer.drain()
        await asyncio.sleep(0.2)
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
        proxy = GuardProxy(allow=lambda ip, p: p == port)
        url = await _listen(proxy)
        try:
            # a second request on the same connection (to anywhere) is never sent on
            page = await _ask(url, f"GET http://127.0.0.1:{port}/a/b?c=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                   f"Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nX-Kept: 1\r\n\r\n"
                                   f"GET http://10.0.0.1/ HTTP/1.1\r\n\r\n".encode())
            assert page.endswith(b"hello") and page.startswith(b"HTTP/1.1 200"), page
            assert b"Connection: close" in page and b"keep-alive" not in page  # the browser sends nothing more on it
            head = seen[-1]
            assert head.startswith(b"GET /a/b?c=1 HTTP/1.1\r\n"), head  # origin form, to the address checked
            assert b"X-Kept: 1" in head and b"Connection: close" in head
            assert b"Proxy-Authorization" not in head and b"keep-alive" not in head
            posted = await _ask(url, f"POST http://127.0.0.1:{port}/form HTTP/1.1\r\nContent-Length: 4\r\n\r\n"
                                     f"a=12GET /more HTTP/1.1\r\n\r\n".encode())
            assert posted.endswith(b"hello") and seen[-1].endswith(b"\r\n\r\na=12"), seen[-1]
            tunnel = await _ask(url, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nPING x\r\n\r\n".encode())
            assert tunnel.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nPONG PING x"), tunnel
            for refused in (f"CONNECT 127.0.0.1:{port + 1} HTTP/1.1\r\n\r\n",
                            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n",
                            "GET http://localhost:9/ HTTP/1.1\r\n\r\n"):
                answer = await _ask(url, refused.encode())
                assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"internal address" in answer, (refused, answer)
            for bad in ("GET /relative HTTP/1.1\r\n\r\n", "CONNECT nowhere HTTP/1.1\r\n\r\n",
                        "GET ftp://example.com/ HTTP/1.1\r\n\r\n", "hello\r\n\r\n", "CONNECT 1.1.1.1:99999 HTTP/1.1\r\n\r\n",
                        f"POST http://127.0.0.1:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"):
                answer = await _ask(url, bad.encode())
                assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403")), (bad, answer)
            assert len(seen) == 3 and proxy.refused == 9  # nothing refused reached the upstream
        finally:
            await proxy.close()
            upstream.close()

    asyncio.run(main())


def test_the_guard_proxy_answers_a_slow_head_and_holds_a_bounded_number_of_connections(monkeypatch):
    from hermes_batch.tools import guard_proxy

    monkeypatch.setattr(guard_proxy, "HEAD_SECONDS", 2.0)  # the three idle ones must still be held when the fourth asks
    monkeypatch.setattr(guard_proxy, "MAX_CONNECTIONS", 3)

    async def main():
        proxy = GuardProxy()
        url = await _listen(proxy)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        try:
            idle = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
            await asyncio.sleep(0.1)
            assert (await _ask(url, b"GET http://example.com/ HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503")
            answers = [await asyncio.wait_for(r.read(), 5) for r, _ in idle]  # each ends, said why
            assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
            for _, w in idle:
                w.close()
        finally:
            await proxy.close()

    asyncio.run(main())


def test_one_sandbox_s_idle_connections_do_not_take_another_sandbox_s_turn(monkeypatch):
    """A review: one prompt's half-sent heads filled the worker's cap and gave every other prompt 503s."""
    from hermes_batch.tools import guard_proxy

    monkeypatch.setattr(guard_proxy, "HEAD_SECONDS", 3.0)
    monkeypatch.setattr(guard_proxy, "MAX_PER_SANDBOX", 3)

    async def main():
        seen: list[bytes] = []
        upstream = await _upstream(seen)
        port = upstream.sockets[0].getsockname()[1]
        proxy = GuardProxy(allow=lambda ip, p: p == port)
        greedy, other = await _listen(proxy, "greedy"), await _listen(proxy, "other")
        host, greedy_port = greedy.removeprefix("http://").rsplit(":", 1)
        try:
            held = [await asyncio.open_connection(host, int(greedy_port)) for _ in range(3)]
            await asyncio.sleep(0.1)
            request = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode()
            assert (await _ask(greedy, request)).startswith(b"HTTP/1.1 503")  # its own fourth: refused
            assert (await _ask(other, request)).endswith(b"hello")  # another sandbox's: served
            for _, w in held:
                w.close()
        finally:
            await proxy.close()
            upstream.close()

    asyncio.run(main())


def test_a_sandbox_s_connections_end_when_it_stops_being_served():
    async def main():
        proxy = GuardProxy()
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]
        stop = await proxy.serve(listener, "s")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0.1)
        assert proxy.open == 1
        await stop()
        assert await asyncio.wait_for(reader.read(), 5) == b"" and proxy.open == 0
        writer.close()
        await proxy.close()

    asyncio.run(main())


def test_addresses_that_carry_an_internal_ipv4_address_are_not_public():
    import ipaddress

    from hermes_batch.tools.netguard import public_only

    for internal in ("64:ff9b::a00:5", "64:ff9b::a9fe:a9fe", "64:ff9b:1:a00:5::", "2002:7f00:1::", "::7f00:1",
                     "::ffff:0:7f00:1", "::ffff:10.0.0.1", "fec0::1", "fc00::1", "fe80::1", "::1", "ff02::1", "100::1"):
        assert not public_only(ipaddress.ip_address(internal), 80), internal
    for public in ("2606:4700::1111", "64:ff9b::808:808", "2002:808:808::", "9.9.9.9"):
        assert public_only(ipaddress.ip_address(public), 443), public
    assert not public_only(ipaddress.ip_address("9.9.9.9"), 0)
