"""Concurrency limits. The model limit adapts: it shrinks on 429s and grows back on success; the
workers of a run share the signal, since the provider's limit is the run's, not one worker's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class AdaptiveLimit:
    """An async semaphore whose size moves between 1 and `maximum` (AIMD, as TCP does).

    A rate-limit episode cuts the limit to 80% (once per `cooldown` seconds, so one burst of 429s
    counts once); every `limit` successes add one slot back. `on_cut` hears of each cut this
    limit's own requests caused (the worker tells the others); `rate_limited(shared=True)` is a
    cut another worker saw, applied here without echoing it back.
    """

    def __init__(self, maximum: int, *, decrease: float = 0.8, cooldown: float = 15.0,
                 on_cut: Callable[[], None] | None = None):
        self.maximum = max(1, maximum)
        self.limit = self.maximum
        self.in_flight = 0
        self.decrease = decrease
        self.cooldown = cooldown
        self._last_cut = -float("inf")
        self._successes = 0
        self._cond = asyncio.Condition()
        self._wakers: set[asyncio.Task] = set()
        self.on_cut = on_cut

    async def __aenter__(self) -> AdaptiveLimit:
        async with self._cond:
            await self._cond.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1
        return self

    async def __aexit__(self, *exc) -> None:
        async with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()

    def rate_limited(self, shared: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_cut < self.cooldown:
            return
        self._last_cut = now
        self._successes = 0
        self._set(max(1, int(self.limit * self.decrease)))
        if not shared and self.on_cut is not None:
            self.on_cut()

    def succeeded(self) -> None:
        if self.limit >= self.maximum:
            return
        self._successes += 1
        if self._successes >= self.limit:
            self._successes = 0
            self._set(self.limit + 1)

    def _set(self, value: int) -> None:
        if value != self.limit:
            self.limit = value
            task = asyncio.get_running_loop().create_task(self._wake())
            self._wakers.add(task)  # keep a reference until it has run
            task.add_done_callback(self._wakers.discard)

    async def _wake(self) -> None:
        async with self._cond:
            self._cond.notify_all()


class OutageBreaker:
    """Holds back new prompts while the model endpoint is down, so an outage does not burn the
    dataset: after `threshold` prompts in a row fail for the endpoint's sake (unreachable, 5xx,
    429 past its retries) it opens for a pause, then lets one prompt through as a probe; success
    closes it, another failure reopens it for twice as long (up to `max_pause`)."""

    def __init__(self, threshold: int, *, pause: float = 15.0, max_pause: float = 240.0, give_up: float = 1800.0):
        self.threshold = threshold
        self.base_pause, self.max_pause, self.give_up = pause, max_pause, give_up
        self.streak = 0
        self.pause = pause
        self.open_until: float | None = None  # None: closed
        self.down_since: float | None = None
        self.probing = False

    @property
    def is_open(self) -> bool:
        return self.open_until is not None

    def allows(self, in_flight: int, now: float) -> bool:
        """May another prompt start now?"""
        if self.open_until is None:
            return True
        if now < self.open_until or in_flight > 0:
            return False
        self.probing = True  # the pause is over: one prompt tries the endpoint
        return True

    def outcome(self, endpoint_failed: bool, now: float) -> str | None:
        """Feed one prompt's outcome; returns a message when the state changes."""
        if not endpoint_failed:
            self.streak = 0
            if self.open_until is None:
                return None
            down = now - (self.down_since or now)
            self.open_until = self.down_since = None
            self.pause, self.probing = self.base_pause, False
            return f"the model endpoint answers again after {down:.0f} s; going on"
        self.streak += 1
        if self.open_until is None and self.streak < self.threshold:
            return None
        if self.open_until is not None and not self.probing:
            return None  # prompts that were in flight when it opened
        if self.open_until is not None:
            self.pause = min(self.max_pause, self.pause * 2)
        self.down_since = self.down_since or now
        self.open_until = now + self.pause
        self.probing = False
        return (f"the model endpoint looks down ({self.streak} prompts in a row failed on it); "
                f"no new prompt starts for {self.pause:.0f} s, then one tries again")

    def gave_up(self, now: float) -> bool:
        return self.down_since is not None and now - self.down_since > self.give_up
