"""Agent loops on a Ray cluster (`--executor=ray`): the run stays the single writer on this machine.

Each `LoopHost` is an async Ray actor holding a `Worker` (worker.py): its share of the run's loops
and sandboxes, on whichever node Ray placed it (actors are spread over the nodes), so a prompt's
sandbox starts on that node (its Docker engine, its Apptainer; Modal and Flame as ever). The run
hands over one prompt per free loop and gets back the same messages a worker process sends; no
node writes a run file. A prompt whose actor or node dies is recorded as failed (`worker_died`),
so `--resume` runs it again, and a new actor takes over the dead one's share on a node still alive
(up to three replacements per actor, as for worker processes).

The API key goes to the actors as an object in Ray's object store, never as an argument, an
environment variable or job metadata, so it shows in no dashboard, log or job description.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import RunConfig
from ..episode import Fatal, Finished, Note, RateLimited, WorkItem
from ..errors import EXIT_FATAL, RunAborted, UserError
from ..record import failure
from .executor import BATCH, OnOutcome

SPARE_CALLS = 4  # actor calls beyond its loops: throttle, close, node


def _probe(address: str) -> None:
    """Fail at once, with the reason, when nothing listens at `address` (host:port or ray://host:port)."""
    where = address.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray_address={address!r}: expected auto, host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise UserError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def _hide_key_from_job_table(ray: Any) -> None:
    """Ray records the driver's command line (read from /proc) as the job's entrypoint, shown in
    its job table and dashboard: an `--api_key` given on it must not go with it."""
    utils = ray._private.utils
    original = utils.get_entrypoint_name
    if getattr(original, "hides_api_key", False):
        return

    def entrypoint() -> str:
        return re.sub(r"(--api_key[=\s])\S+", r"\1***", original())

    entrypoint.hides_api_key = True  # type: ignore[attr-defined]
    utils.get_entrypoint_name = entrypoint


def check_reachable(address: str | None) -> None:
    """Ray importable and its cluster answering (a start-up check that needs no model)."""
    _import_ray()
    if address not in (None, "auto"):
        _probe(address)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UserError("--executor=ray needs Ray: pip install -e '.[ray]'") from exc
    return ray


class LoopHost:
    """The actor's body (made a Ray actor class by `_actor_class`): one Worker, made on first use
    inside the actor's event loop."""

    def __init__(self, number: int, config_data: dict[str, Any], key_box: list[Any], context: dict[str, Any],
                 loops: int, sandboxes: int):
        self.number = number
        self.config = RunConfig.model_validate(config_data)
        self.key_box = key_box  # [the API key's object ref]: in a list, so Ray hands over the ref, not the key
        self.context, self.loops, self.sandboxes = context, loops, sandboxes
        self.worker: Any = None
        self.cuts = 0  # 429 episodes met here since the run last asked
        self.notes: list[str] = []  # what the user should read, not yet handed over

    async def _ready(self) -> Any:
        if self.worker is None:
            from .worker import Worker  # the actor's process imports the agent stack, the driver need not

            api_key, judge_key, toolset_keys = await self.key_box[0]
            worker = Worker(self.number, self.config, api_key, self.context, self.loops, self.sandboxes,
                            emit=self._heard, judge_key=judge_key, toolset_keys=toolset_keys)
            self.worker = worker
            await worker.open()
        return self.worker

    def _heard(self, msg: Any) -> None:
        if isinstance(msg, RateLimited):
            self.cuts += 1
        elif isinstance(msg, Note):
            self.notes.append(msg.text)

    async def run(self, item: WorkItem) -> tuple[Finished | Fatal, int, str, list[str]]:
        """(what to tell the run, 429 episodes met since the last call, this node's id, notes)"""
        import ray

        worker = await self._ready()
        msg = await worker.run_one(item)
        cuts, self.cuts = self.cuts, 0
        notes, self.notes = self.notes, []
        return msg, cuts, ray.get_runtime_context().get_node_id(), notes

    async def throttle(self) -> None:
        (await self._ready()).throttle()

    async def node(self) -> str:
        import ray

        await self._ready()  # a backend that cannot start here fails the run now, not prompt by prompt
        return ray.get_runtime_context().get_node_id()

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.close()


@dataclass
class _Actor:
    number: int
    handle: Any
    capacity: int
    sandboxes: int
    node: str  # where it was placed; once it answers, where it says it runs
    started: bool = False
    in_flight: dict[str, tuple[WorkItem, float, Any]] = field(default_factory=dict)  # id → (item, at, ref)
    dead: bool = False


class RayExecutor:
    def __init__(self, config: RunConfig, api_key: str | None, context: dict[str, Any],
                 shares: list[tuple[int, int]], on_outcome: OnOutcome, say: Callable[[str], None]):
        self.ray = _import_ray()
        self.config, self.context, self.shares = config, context, shares
        self.on_outcome, self.say = on_outcome, say
        self.actors: list[_Actor] = []
        self.refs: dict[Any, tuple[_Actor, str]] = {}  # call in flight → (its actor, prompt id)
        self.per_node: Counter = Counter()
        self.stopping = self.stopped = False
        self.replacements_left = 3 * len(shares)
        self.host: Any = None  # the Ray actor class, made at start()
        self.stored = config.model_dump(mode="json", exclude={"api_key"})  # what every actor is configured from
        self.bad_nodes: set[str] = set()  # nodes an actor died on: not chosen again in this run
        self.said: set[str] = set()  # notes shown already
        self.owns_ray = not self.ray.is_initialized()
        address = config.ray_address
        if self.owns_ray and address not in (None, "auto"):
            _probe(address)  # Ray itself keeps retrying an address that does not answer for minutes
        _hide_key_from_job_table(self.ray)
        try:
            if self.owns_ray:
                self.ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                              include_dashboard=False if address is None else None, configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise UserError(f"cannot reach the Ray cluster at {address or '(a local Ray)'}: {exc}") from exc
        # by reference: the keys are in no call's arguments (the judge's: an actor's environment is not ours)
        self.key_ref = self.ray.put((api_key, os.environ.get("JUDGE_API_KEY"), config.toolset_keys()))

    def start(self) -> None:
        ray = self.ray
        self.host = ray.remote(LoopHost)
        nodes = self._nodes()
        for n, (loops, sandboxes) in enumerate(self.shares):
            self.actors.append(self._spawn(n, loops, sandboxes, nodes[n % len(nodes)]))  # round-robin over nodes
        waiting = {a.handle.node.remote(): a for a in self.actors}
        deadline = time.monotonic() + 120
        problem = ""
        while waiting and time.monotonic() < deadline:
            ready, _ = ray.wait(list(waiting), num_returns=1, timeout=max(0.1, deadline - time.monotonic()))
            for ref in ready:
                actor = waiting.pop(ref)
                try:
                    actor.node, actor.started = ray.get(ref), True
                except ray.exceptions.RayError as exc:  # e.g. its node died and the cluster does not know yet
                    problem = f"{type(exc).__name__}: {str(exc)[:300]}"
                    successor = self._replace(actor)
                    if successor is not None:
                        waiting[successor.handle.node.remote()] = successor
        live = [a for a in self.actors if not a.dead and a.started]
        if not live:
            raise RunAborted(f"no Ray actor could start on the cluster; last error: {problem or 'none came up in 120 s'}",
                             EXIT_FATAL)
        self.say(f"Ray: {len(live)} actors on {len({a.node for a in live})} node(s)")

    def _nodes(self) -> list[str]:
        return sorted(n["NodeID"] for n in self.ray.nodes() if n.get("Alive"))

    def _spawn(self, number: int, loops: int, sandboxes: int, node: str) -> _Actor:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        handle = self.host.options(
            num_cpus=0, max_concurrency=loops + SPARE_CALLS, max_restarts=0, max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),  # soft placement clusters them
        ).remote(number, self.stored, [self.key_ref], self.context, loops, sandboxes)
        return _Actor(number, handle, loops, sandboxes, node)

    def room(self) -> int:
        return sum(a.capacity - len(a.in_flight) for a in self.actors if not a.dead)

    def submit(self, item: WorkItem) -> None:
        actor = max((a for a in self.actors if not a.dead), key=lambda a: a.capacity - len(a.in_flight))
        ref = actor.handle.run.remote(item)
        actor.in_flight[item.id] = (item, time.monotonic(), ref)
        self.refs[ref] = (actor, item.id)

    def in_flight(self) -> int:
        return len(self.refs)

    def alive(self) -> bool:
        return any(not a.dead for a in self.actors)

    def poll(self, timeout: float) -> int:
        if not self.refs:
            time.sleep(min(timeout, 0.05))
            return 0
        ready, rest = self.ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        handled = 0
        for ref in ready[:BATCH]:
            handled += self._settle(ref)
        return handled

    def _settle(self, ref: Any) -> int:
        actor, pid = self.refs.pop(ref)
        held = actor.in_flight.pop(pid, None)
        try:
            msg, cuts, node, notes = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return 0
        except self.ray.exceptions.RayError as exc:  # the actor, or its node, died under the prompt
            self._replace(actor)
            if held is None:
                return 0
            item = held[0]
            self.on_outcome(item, failure(item.id, item.index, item.attempt, "worker_died",
                                          f"Ray actor {actor.number} (node {actor.node[:12]}) died: "
                                          f"{type(exc).__name__}: {str(exc)[:500]}"))
            return 1
        for text in notes:
            if text not in self.said:
                self.said.add(text)
                self.say(f"note: {text}")
        if cuts:  # the endpoint's rate limit is the run's: every other actor cuts its request limit too
            for other in self.actors:
                if other is not actor and not other.dead:
                    other.handle.throttle.remote()
        if isinstance(msg, Fatal):
            if self.stopping:
                return 0
            raise RunAborted(msg.message, EXIT_FATAL)
        if held is None:
            return 0  # settled already (the watchdog gave up on it)
        actor.node = node
        self.per_node[node] += 1
        self.on_outcome(held[0], msg.outcome)
        return 1

    def _replace(self, actor: _Actor) -> _Actor | None:
        """A dead actor's successor, on another node (the dead one's may be gone), within the budget."""
        if actor.dead:
            return None
        actor.dead = True
        if self.replacements_left <= 0 or self.stopping:
            return None
        self.replacements_left -= 1
        self.bad_nodes.add(actor.node)
        nodes = [n for n in self._nodes() if n not in self.bad_nodes] or self._nodes()
        number = max(a.number for a in self.actors) + 1
        successor = self._spawn(number, actor.capacity, actor.sandboxes, nodes[number % len(nodes)])
        self.actors.append(successor)
        self.say(f"Ray actor {actor.number} (node {actor.node[:12]}) died; actor {number} takes over its share")
        return successor

    def overdue(self, limit: Callable[[WorkItem], float]) -> list[tuple[WorkItem, str]]:
        now = time.monotonic()
        late = []
        for actor in self.actors:
            for pid in [p for p, (item, at, _) in actor.in_flight.items() if now - at > limit(item)]:
                item, _, ref = actor.in_flight.pop(pid)
                self.refs.pop(ref, None)
                self.ray.cancel(ref)
                late.append((item, f"Ray actor {actor.number} (node {actor.node[:12]})"))
        return late

    def stop(self, grace: float) -> None:
        if self.stopped:
            return
        self.stopped = self.stopping = True
        ray = self.ray
        try:
            for ref in list(self.refs):
                ray.cancel(ref)  # each prompt's loop ends and closes its sandbox
            deadline = time.monotonic() + grace
            while self.refs and time.monotonic() < deadline:
                try:
                    self.poll(0.2)  # what finished meanwhile is kept
                except KeyboardInterrupt:
                    break
            closing = [a.handle.close.remote() for a in self.actors if not a.dead]
            try:
                ray.wait(closing, num_returns=len(closing), timeout=max(1.0, deadline - time.monotonic()))
            except Exception:  # an actor that is gone has nothing to close
                pass
            for a in self.actors:
                ray.kill(a.handle, no_restart=True)
            if self.per_node:
                spread = ", ".join(f"{node[:12]}: {n}" for node, n in self.per_node.most_common())
                self.say(f"Ray: prompts settled per node: {spread}")
        finally:
            if self.owns_ray:
                ray.shutdown()
