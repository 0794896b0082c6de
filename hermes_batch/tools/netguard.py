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

import ada_url
import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# IPv6 forms that carry an IPv4 address a router may forward to (NAT64, 6to4, IPv4-compatible,
# IPv4-translated): the IPv4 address inside is what is reached, and is what is checked
_EMBEDDING = [(ipaddress.ip_network(n), take) for n, take in (
    ("64:ff9b::/96", lambda a: ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)),
    ("64:ff9b:1::/48", lambda a: ipaddress.IPv4Address((int(a) >> 48) & 0xFFFFFFFF)),
    ("2002::/16", lambda a: a.sixtofour),
    ("::/96", lambda a: ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)),
    ("::ffff:0:0:0/96", lambda a: ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)),
)]
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
DNS_SECONDS = 10.0  # a name whose nameserver never answers holds a resolver thread no longer


def public_only(ip: Address, port: int) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        else:
            inside = next((take(ip) for net, take in _EMBEDDING if ip in net), None)
            if inside is not None:
                return public_only(inside, port)
            if ip not in _GLOBAL_UNICAST or ip.is_site_local:
                return False
    return ip.is_global and not ip.is_multicast and 0 < port < 65536


class AddressRefused(httpcore.ConnectError):
    """The host is, or resolves to, an address the runner must not fetch from."""


_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")


async def refuse_internal(url: str, allow: Callable[[Address, int], bool] = public_only) -> str:
    """For a URL handed to a web provider that fetches it itself (perhaps self-hosted, inside this
    network): the URL to hand over, or AddressRefused if its host is, or resolves here to, an
    internal address. A host that does not resolve here is the provider's business.

    Fetchers read URLs as browsers do (WHATWG: Node, Chromium, Firecrawl), where `127.0.0.1.` is
    loopback and `http://127.0.0.1:8080\\@example.com/` goes to 127.0.0.1; Python's parsers read
    some of these otherwise. The host is taken both ways; either one internal, or the two
    disagreeing, is refused; and the provider is handed the canonical form that was checked."""
    try:
        whatwg = ada_url.URL(url)
    except ValueError:
        raise AddressRefused(f"refused to hand over {url!r}: it is not a valid URL") from None
    if whatwg.protocol not in ("http:", "https:"):
        raise AddressRefused(f"refused to hand over {url!r}: only http and https URLs")
    host = whatwg.hostname.strip("[]").lower()
    try:
        other = httpx.URL(url).host.strip("[]").lower().rstrip(".")
    except (httpx.InvalidURL, ValueError):
        other = ""
    if other != host.rstrip(".") and _as_address(other) != _as_address(host):
        raise AddressRefused(f"refused to hand over {url!r}: its host reads as {host!r} to a browser and "
                             f"{other or 'nothing'!r} to other parsers (an internal address may hide behind it)")
    name = host.rstrip(".")
    if name in _LOCAL_NAMES or name.endswith(_LOCAL_SUFFIXES) or "." not in name and _as_address(name) is None:
        raise AddressRefused(f"refused to fetch from {host}: it is an internal address (a name for this machine "
                             "or its network)")
    port = int(whatwg.port) if whatwg.port else (443 if whatwg.protocol == "https:" else 80)
    address = _as_address(name)
    if address is not None:
        addresses = {address}
    else:
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM), 5)
        except (TimeoutError, OSError):
            return whatwg.href
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}
    refused = sorted(str(a) for a in addresses if not allow(a, port))
    if refused:
        raise AddressRefused(f"refused to fetch from {host}: it is an internal address ({', '.join(refused)})")
    return whatwg.href


async def public_addresses(host: str, port: int, allow: Callable[[Address, int], bool] = public_only) -> list[Address]:
    """The addresses to connect to for `host`, in the resolver's order of preference: it resolved
    here to addresses `allow` admits, all of them (connect to one of these, never resolve again).
    AddressRefused otherwise."""
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG), DNS_SECONDS)
    except (socket.gaierror, TimeoutError) as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc or 'no answer in time'}") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    refused = sorted(str(a) for a in addresses if not allow(a, port))
    if refused or not addresses:
        raise AddressRefused(f"refused to fetch from {host}: it is an internal address ({', '.join(refused)})")
    return addresses


def _as_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, allow: Callable[[Address, int], bool]):
        self.inner = httpcore.AnyIOBackend()
        self.allow = allow

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        failure: Exception | None = None
        for address in await public_addresses(host, port, self.allow):  # in the resolver's order of preference
            try:
                return await self.inner.connect_tcp(str(address), port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

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
