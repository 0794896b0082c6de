"""An HTTP client for fetches a model asks for: public addresses only, checked at connect time.

Every connection (the first request and each redirect) resolves the host itself, refuses it if
any address is loopback, private, link-local (cloud metadata), shared, multicast or reserved,
and then connects to the address it checked, so a DNS answer that changes between check and
connect (rebinding) cannot slip through.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable

import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def public_only(ip: Address, port: int) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class AddressRefused(httpcore.ConnectError):
    """The host is, or resolves to, an address the runner must not fetch from."""


async def refuse_internal(url: str, allow: Callable[[Address, int], bool] = public_only) -> None:
    """For a URL handed to a web provider that fetches it itself (perhaps self-hosted, inside this
    network): refuse it if its host is, or resolves here to, an internal address. A host that does
    not resolve here is the provider's business."""
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = {ipaddress.ip_address(parsed.host.strip("[]"))}
    except ValueError:
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM), 5)
        except (TimeoutError, OSError):
            return
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}
    refused = sorted(str(a) for a in addresses if not allow(a, port))
    if refused:
        raise AddressRefused(f"refused to fetch from {parsed.host}: it is an internal address ({', '.join(refused)})")


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, allow: Callable[[Address, int], bool]):
        self.inner = httpcore.AnyIOBackend()
        self.allow = allow

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        addresses = sorted({ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}, key=str)
        refused = [str(a) for a in addresses if not self.allow(a, port)]
        if refused or not addresses:
            raise AddressRefused(f"refused to fetch from {host}: it is an internal address ({', '.join(refused)})")
        return await self.inner.connect_tcp(str(addresses[0]), port, timeout=timeout, local_address=local_address,
                                            socket_options=socket_options)

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise AddressRefused("refused to fetch through a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, allow: Callable[[Address, int], bool] = public_only):
        super().__init__(trust_env=False)  # a proxy would fetch internal addresses on our behalf
        # httpx builds its pool without a way to pass a network backend: rebuild it with ours
        self._pool = httpcore.AsyncConnectionPool(ssl_context=httpx.create_ssl_context(),
                                                  network_backend=_GuardedBackend(allow))


def guarded_client(allow: Callable[[Address, int], bool] = public_only, **kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=GuardedTransport(allow), trust_env=False, **kwargs)
