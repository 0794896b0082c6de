"""A network of its own for every sandbox, and the runner's one way out of it (`--network`).

No sandbox shares a network namespace with the host or with another sandbox (local: the jail's own;
Apptainer: `--net --network none`; Docker: `none`): loopback, listening ports and abstract unix
sockets are the prompt's alone, so no prompt reaches another prompt's browser, servers or sockets,
nor a service of this machine. With `--network` the sandbox is given one way out: the runner places
a listening socket inside the sandbox's namespace, on its own loopback at `EGRESS_URL`, and serves
it with the network guard (tools/guard_proxy.py: an HTTP proxy that reaches public addresses only).
The agent's commands find it through the usual proxy variables (`egress_env`), the browser through
Chromium's proxy setting. Nothing else leaves: no DNS, no raw TCP or UDP to anywhere.

The socket is made by a short helper process that joins the sandbox's network namespace (and, for
a runner without root, the user namespace that owns it) from this machine: it never resolves a
path inside the sandbox, and the socket it hands back is the runner's, which the prompt can use but
neither close nor take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import socket
import sys

from .errors import SandboxError

EGRESS_HOST = "127.0.0.1"  # the sandbox's own loopback
EGRESS_PORT = 3128  # made before the prompt's first command, so nothing of the prompt's can hold it
EGRESS_URL = f"http://{EGRESS_HOST}:{EGRESS_PORT}"
PLANT_SECONDS = 30.0

# Run with the runner's Python, from this machine's files: join the namespaces of the process whose
# network namespace is on descriptor argv[1] (its owning user namespace first, when not root), then
# listen there and hand the listening socket back over the unix socket on descriptor argv[2].
_HELPER = r"""
import ctypes, fcntl, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
net, back, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def enter(fd, kind):
    if libc.setns(fd, kind) != 0:
        raise OSError(ctypes.get_errno(), "setns")
if os.geteuid() != 0:
    enter(fcntl.ioctl(net, 0xB701), 0x10000000)  # NS_GET_USERNS; CLONE_NEWUSER
enter(net, 0x40000000)  # CLONE_NEWNET
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", port))
s.listen(256)
socket.send_fds(socket.socket(fileno=back), [b"ok"], [s.fileno()])
"""


# IANA's special-purpose IPv4 blocks (RFC 6890 and its updates): loopback, private, shared (CGNAT),
# link-local (cloud metadata), documentation, benchmarking, multicast, reserved
SPECIAL_IPV4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
                "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
                "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4")


@functools.cache
def public_ipv4() -> tuple[str, ...]:
    """Every public IPv4 address, as CIDR blocks: what a sandbox whose network is a provider's
    (Modal's) may reach with --network, where the runner cannot place its guard."""
    left = [ipaddress.IPv4Network("0.0.0.0/0")]
    for special in map(ipaddress.IPv4Network, SPECIAL_IPV4):
        left = [part for net in left for part in (net.address_exclude(special) if special.subnet_of(net) else [net])]
    return tuple(str(n) for n in sorted(left))


def egress_env() -> dict[str, str]:
    """The variables that send a sandbox's HTTP(S) clients (curl, pip, git, npm, requests...) out
    through its way out; its own loopback stays direct."""
    env = {}
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = EGRESS_URL
    for name in ("no_proxy", "NO_PROXY"):
        env[name] = "localhost,127.0.0.1,::1"
    return env


async def listener_inside(pid: int, port: int = EGRESS_PORT) -> socket.socket:
    """A socket listening on EGRESS_HOST:`port` inside the network namespace of process `pid`."""
    try:
        net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"cannot open the network namespace of the sandbox's process {pid}: {exc}") from exc
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _HELPER, str(net), str(theirs.fileno()), str(port),
            pass_fds=(net, theirs.fileno()), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
        theirs.close()
        try:
            _, err = await asyncio.wait_for(proc.communicate(), PLANT_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise SandboxError(f"placing the way out in the sandbox's network took over {PLANT_SECONDS:g} s") from None
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            raise SandboxError(f"cannot place the way out in the sandbox's network: {why[0]}")
        ours.settimeout(5)  # the helper has ended: its answer is already there, or never comes
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except OSError:
            fds = []
        if len(fds) != 1:
            raise SandboxError("the helper placing the way out in the sandbox's network handed back no socket")
        listener = socket.socket(fileno=fds[0])
        listener.setblocking(False)
        return listener
    finally:
        os.close(net)
        ours.close()
        if theirs.fileno() != -1:
            theirs.close()
