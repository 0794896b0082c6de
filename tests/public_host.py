"""A host at a public address, on this machine: a network namespace of the test's own, joined to
the host by a veth pair and routed, holding `PUBLIC_ADDRESS` and serving pages on it. Traffic to it
never leaves the machine; the route and the namespace are removed afterwards. Needs root and iproute2.

    /            a page that says PUBLIC_TEXT
    /jump?to=U   a redirect to U (a public page sending the browser somewhere internal)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

PUBLIC_ADDRESS = "9.9.9.9"  # global, so the guard lets it through; routed here only while the test runs
PUBLIC_TEXT = "A page on the public internet"

_SERVER = r'''
import http.server, socketserver, sys, urllib.parse
class Server(http.server.ThreadingHTTPServer):
    def server_bind(self):  # HTTPServer's own asks DNS for its name: slow where no resolver answers
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/jump":
            self.send_response(302)
            self.send_header("Location", urllib.parse.parse_qs(url.query)["to"][0])
            self.end_headers()
            return
        body = b"<!doctype html><title>Public</title><h1>" + sys.argv[3].encode() + b"</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
Server((sys.argv[1], int(sys.argv[2])), Page).serve_forever()
'''


def internal_address() -> str | None:
    """An address of this machine's other than loopback (an interface's own): where a service of
    it listening on every address is reached from a network that is not its loopback."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = [f.split()[3].split("/")[0] for f in out.splitlines() if len(f.split()) > 3 and f.split()[1] != "lo"]
    return found[0] if found else None


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "a public address is made in a network namespace, which needs root"
    if not shutil.which("ip"):
        return "iproute2 is missing (apt-get install iproute2)"
    return None


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)


@contextlib.contextmanager
def public_host(port: int = 8080) -> Iterator[str]:
    """The base URL of the public host, `http://PUBLIC_ADDRESS:port`, serving the pages above."""
    with public_server([sys.executable, "-c", _SERVER, PUBLIC_ADDRESS, str(port), PUBLIC_TEXT], {}, port) as base:
        yield base


@contextlib.contextmanager
def public_server(argv: list[str], env: dict[str, str], port: int = 8080) -> Iterator[str]:
    """`argv` serving HTTP at `http://PUBLIC_ADDRESS:port` (the base URL), in the namespace. One at a
    time on this machine (a lock file): the address has one route, which two tests at once (two
    lanes) would fight over."""
    with open("/tmp/hermes-batch-public-host.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _public_host(argv, env, port) as base:
            yield base


@contextlib.contextmanager
def _public_host(argv: list[str], env: dict[str, str], port: int) -> Iterator[str]:
    tag = f"{os.getpid() % 100000}"
    ns, outside, inside = f"hbpub{tag}", f"hbpo{tag}", f"hbpi{tag}"
    link = f"10.213.{os.getpid() % 250}."
    server = None
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("addr", "add", f"{link}1/30", "dev", outside)
        _ip("link", "set", outside, "up")
        for args in (["addr", "add", f"{link}2/30", "dev", inside], ["addr", "add", f"{PUBLIC_ADDRESS}/32", "dev", inside],
                     ["link", "set", inside, "up"], ["link", "set", "lo", "up"],
                     ["route", "add", "default", "via", f"{link}1"]):
            _ip("netns", "exec", ns, "ip", *args)
        _ip("route", "add", f"{PUBLIC_ADDRESS}/32", "via", f"{link}2")
        server = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env={**os.environ, **env})
        base = f"http://{PUBLIC_ADDRESS}:{port}"
        for _ in range(150):  # listening: a connection is taken (whatever it answers)
            try:
                socket.create_connection((PUBLIC_ADDRESS, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the public host at {base} did not answer")
        yield base
    finally:
        if server is not None:
            server.kill()
            server.wait(10)
        _ip("route", "del", f"{PUBLIC_ADDRESS}/32", check=False)
        _ip("link", "del", outside, check=False)
        _ip("netns", "del", ns, check=False)
