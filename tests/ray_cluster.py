"""A real Ray cluster on this host for tests: a head and more nodes, each started by `ray start`
as separate processes, found again by pid (their command lines name this cluster's temp dir;
their children by parentage) and ended by pid, never by name."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _table() -> dict[int, tuple[int, bytes]]:
    """pid → (parent pid, command line) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            out[int(entry)] = (ppid, Path(f"/proc/{entry}/cmdline").read_bytes())
        except (OSError, IndexError, ValueError):
            continue
    return out


def _with_descendants(roots: set[int], table: dict[int, tuple[int, bytes]]) -> set[int]:
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier and pid not in found}
        found |= frontier
    return found


class RayCluster:
    def __init__(self, temp_dir: Path):
        self.temp_dir = temp_dir  # short: Ray's socket paths must fit in 107 bytes
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes = 0
        # a HOME of its own: Ray keeps state in ~/.ray (an auth token one local ray.init() leaves
        # there makes every later `ray start` cluster refuse its own nodes)
        home = temp_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}

    def _ray_start(self, *args: str) -> None:
        res = subprocess.run([RAY, "start", *args, "--num-cpus=1", "--disable-usage-stats",
                              f"--resources={json.dumps({f'hb_node_{self.nodes}': 1})}"],
                             capture_output=True, text=True, timeout=120, env=self.env)
        if res.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        self.nodes += 1

    def start(self, nodes: int = 2) -> RayCluster:
        self._ray_start("--head", "--node-ip-address=127.0.0.1", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
                        "--include-dashboard=false", f"--ray-client-server-port={_free_port()}")
        for _ in range(nodes - 1):
            self.add_node()
        return self

    def add_node(self) -> int:
        """Start one more node; its number (its raylet holds the resource hb_node_<number>)."""
        self._ray_start(f"--address={self.address}", "--node-ip-address=127.0.0.1")
        return self.nodes - 1

    def pids(self) -> set[int]:
        """This cluster's processes: those naming its temp dir or its head's port, and their children."""
        table = _table()
        port = re.compile(rb"address=[^\0]*:%d\0" % self.port)  # the client server names only the head
        mine = {pid for pid, (_, cmd) in table.items() if str(self.temp_dir).encode() in cmd or port.search(cmd)}
        return _with_descendants(mine, table)

    def kill_node(self, number: int) -> set[int]:
        """SIGKILL one node's raylet and everything it started (its actors' processes): the node is gone."""
        table = _table()
        raylet = {pid for pid, (_, cmd) in table.items()
                  if b"raylet" in cmd and f"hb_node_{number},".encode() in cmd and str(self.temp_dir).encode() in cmd}
        if not raylet:
            raise RuntimeError(f"no raylet of node {number}")
        doomed = _with_descendants(raylet, table)
        for pid in doomed:
            _kill(pid)
        return doomed

    def stop(self) -> set[int]:
        """SIGKILL every process of this cluster; what is still alive afterwards (should be nothing)."""
        for _ in range(3):
            doomed = self.pids()
            for pid in doomed:
                _kill(pid)
            time.sleep(0.5)
        return {pid for pid in self.pids() if _alive(pid)}


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead, only not yet reaped by its (re)parent
