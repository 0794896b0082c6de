"""Where agent loops run. The run hands an executor `WorkItem`s as it has room and hears of each
one's end exactly once, through `on_outcome`; the executor never writes a file.

`ProcessPool` (the default) runs the loops in worker processes on this machine, each an asyncio
event loop holding its share of the run's loops and sandboxes (worker.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..config import RunConfig
from ..episode import Exited, Fatal, Finished, FromWorker, Note, RateLimited, Run, Stop, Throttle, WorkItem
from ..errors import EXIT_FATAL, RunAborted
from ..record import Outcome, failure
from .worker import worker_main

OnOutcome = Callable[[WorkItem, Outcome], None]
BATCH = 512  # messages handled per poll at most, so the run's loop turns (checkpoint, watchdog)
SERVER_GRACE = 5.0  # seconds the fork server has to end once its pipe from the run is closed
RUN_PID = "HERMES_BATCH_RUN_PID"  # the run's pid, for the fork server's guard (fork_guard.py, which the run never imports)


class Executor(Protocol):
    def start(self) -> None: ...

    def room(self) -> int:
        """How many more items it takes now (its loops in flight are bounded)."""

    def submit(self, item: WorkItem) -> None: ...

    def poll(self, timeout: float) -> int:
        """Hand every waiting outcome to `on_outcome` (waiting up to `timeout` for the first);
        how many. Raises RunAborted when the run must stop (a rejected key)."""

    def in_flight(self) -> int: ...

    def overdue(self, limit: Callable[[WorkItem], float]) -> list[tuple[WorkItem, str]]:
        """Items handed over more than `limit(item)` seconds ago, with where they ran; they are
        dropped here, so a result that comes later is ignored."""

    def alive(self) -> bool: ...

    def stop(self, grace: float) -> None:
        """Stop every loop, handing over what finishes within `grace` seconds; again, nothing."""


@dataclass
class _Process:
    number: int
    process: Any
    tasks: Any
    capacity: int
    sandboxes: int
    in_flight: dict[str, tuple[WorkItem, float]] = field(default_factory=dict)  # id → (item, handed at)
    exited: bool = False


def warm_up() -> None:
    """Start the process the workers are forked from, so its imports overlap the run's own start
    (reading the dataset and the ledger): each worker is then a fork that is ready at once,
    instead of a fresh interpreter importing everything again (a second per worker, on cores the
    run shares). It dies with the run (fork_guard.py) and is ended and reaped by `stop_fork_server`."""
    if "forkserver" in mp.get_all_start_methods():
        from multiprocessing import forkserver

        # the guard kills the server with the thread that starts it: only the main thread's lives as long as the run
        guarded = threading.current_thread() is threading.main_thread()
        _context().set_forkserver_preload([*(["hermes_batch.runner.fork_guard"] if guarded else []),
                                           "hermes_batch.runner.worker"])
        # Python 3.11's fork server ignores the parent's sys.path: pointed at this package's root, its
        # workers run this very code (a checkout run as `python batch_runner.py` that is not the one
        # installed, or not installed at all), never another copy
        given = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), given]))
        os.environ[RUN_PID] = str(os.getpid())
        try:
            forkserver.ensure_running()
        finally:
            del os.environ[RUN_PID]
            if given is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = given


def stop_fork_server(grace: float = SERVER_GRACE) -> None:
    """End the fork server and reap it, so the CPU of the workers it reaped counts as the run's
    (`/usr/bin/time`, any reader of a process's children's usage), and it never outlives the run.
    It ends when its pipe from the run closes; one that does not within `grace` (another process
    holding the pipe open) is killed."""
    if "forkserver" not in mp.get_all_start_methods():
        return
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    with getattr(server, "_lock", threading.Lock()):
        pid, alive = getattr(server, "_forkserver_pid", None), getattr(server, "_forkserver_alive_fd", None)
        if pid is None:
            return
        address = server._forkserver_address
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
        if isinstance(alive, int):
            with contextlib.suppress(OSError):
                os.close(alive)
        if isinstance(address, str) and address and not address.startswith("\0"):
            with contextlib.suppress(OSError):
                os.unlink(address)
        deadline = time.monotonic() + grace
        try:
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return
                time.sleep(0.02)
        except ChildProcessError:  # reaped already
            pass


def _context() -> Any:
    # forkserver, not fork: the server is a clean process with no threads and no sockets of the run
    return mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


class ProcessPool:
    """Worker processes (forked from a clean server) fed through one queue each; results come back on a shared one.

    A worker that dies has its prompts reported failed (`worker_died`) and a replacement takes over
    its share, up to three restarts per worker. A worker's 429 is passed to the others (Throttle):
    the endpoint's rate limit is the run's, not one process's.
    """

    def __init__(self, config: RunConfig, api_key: str | None, context: dict[str, Any],
                 shares: list[tuple[int, int]], on_outcome: OnOutcome, say: Callable[[str], None]):
        self.config = config
        self.api_key = api_key
        self.context = context  # run facts stamped on every record
        self.shares = shares  # (agent loops, live sandboxes) per worker
        self.on_outcome = on_outcome
        self.say = say
        self.notes: set[str] = set()  # said already
        self.mp = _context()
        self.results: Any = None
        self.workers: dict[int, _Process] = {}
        self.restarts_left = 3 * len(shares)
        self.stopping = False
        self._stored = config.model_dump(mode="json", exclude={"api_key"})

    def start(self) -> None:
        self.results = self.mp.Queue()
        for n, (loops, sandboxes) in enumerate(self.shares):
            self._spawn(n, loops, sandboxes)

    def _spawn(self, number: int, loops: int, sandboxes: int) -> None:
        tasks = self.mp.Queue()
        proc = self.mp.Process(target=worker_main, name=f"hermes-batch-worker-{number}", daemon=True,
                               args=(number, self._stored, self.api_key, tasks, self.results, self.context,
                                     loops, sandboxes, os.getpid()))
        proc.start()
        self.workers[number] = _Process(number, proc, tasks, loops, sandboxes)

    def room(self) -> int:
        return sum(w.capacity - len(w.in_flight) for w in self.workers.values() if not w.exited)

    def submit(self, item: WorkItem) -> None:
        for w in self.workers.values():
            if not w.exited and len(w.in_flight) < w.capacity:
                w.in_flight[item.id] = (item, time.monotonic())
                w.tasks.put(Run(item))
                return
        raise RuntimeError("submit() with no room")  # the run checks room() first

    def in_flight(self) -> int:
        return sum(len(w.in_flight) for w in self.workers.values())

    def alive(self) -> bool:
        return any(not w.exited for w in self.workers.values())

    def poll(self, timeout: float) -> int:
        handled = 0
        try:
            msg = self.results.get(timeout=timeout)
        except queue.Empty:
            msg = None
        while msg is not None and handled < BATCH:
            handled += self._receive(msg)
            try:
                msg = self.results.get_nowait()
            except queue.Empty:
                msg = None
        return handled + self._bury_dead()

    def _receive(self, msg: FromWorker) -> int:
        """Act on one message from a worker; 1 if it settled a prompt."""
        w = self.workers.get(msg.worker)
        if isinstance(msg, Finished):
            held = w.in_flight.pop(msg.outcome.id, None) if w is not None else None
            if held is None:
                return 0  # settled already (the watchdog gave up on it)
            self.on_outcome(held[0], msg.outcome)
            return 1
        if isinstance(msg, RateLimited):
            for other in self.workers.values():
                if other.number != msg.worker and not other.exited:
                    other.tasks.put(Throttle())
        elif isinstance(msg, Note) and msg.text not in self.notes:
            self.notes.add(msg.text)
            self.say(f"note: {msg.text}")
        elif isinstance(msg, Fatal) and not self.stopping:
            raise RunAborted(msg.message, EXIT_FATAL)
        elif isinstance(msg, Exited) and w is not None:
            w.exited = True
        return 0

    def _bury_dead(self) -> int:
        """A worker that died without a word (killed, crashed hard): its prompts failed; a successor."""
        lost_count = 0
        for w in list(self.workers.values()):
            if w.exited or w.process.is_alive():
                continue
            w.exited = True
            lost = [item for item, _ in w.in_flight.values()]
            w.in_flight.clear()
            for item in lost:
                self.on_outcome(item, failure(item.id, item.index, item.attempt, "worker_died",
                                              f"worker process {w.number} died (exit code {w.process.exitcode})"))
            lost_count += len(lost)
            if self.restarts_left > 0 and not self.stopping:
                self.restarts_left -= 1
                self._spawn(max(self.workers) + 1, w.capacity, w.sandboxes)  # takes over the dead one's share
        return lost_count

    def overdue(self, limit: Callable[[WorkItem], float]) -> list[tuple[WorkItem, str]]:
        now = time.monotonic()
        late = []
        for w in self.workers.values():
            for pid in [p for p, (item, at) in w.in_flight.items() if now - at > limit(item)]:
                late.append((w.in_flight.pop(pid)[0], f"worker {w.number}"))
        return late

    def stop(self, grace: float) -> None:
        if self.stopping:
            return
        self.stopping = True
        for w in self.workers.values():
            if not w.exited:
                try:
                    w.tasks.put(Stop())
                except (ValueError, OSError):
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(not w.exited and w.process.is_alive() for w in self.workers.values()):
            try:
                msg = self.results.get(timeout=0.2)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                break  # a second Ctrl-C: stop waiting
            self._receive(msg)  # a prompt that finished while stopping is kept
        for w in self.workers.values():
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=2)
