"""The model request limit: it shrinks on 429s and grows back on success; the workers of a run
share the signal, since the provider's limit is the run's, not one worker's."""

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
