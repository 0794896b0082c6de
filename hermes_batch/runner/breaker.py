"""The run's circuit breaker: an endpoint that is down holds new prompts back instead of failing them."""

from __future__ import annotations


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
