"""Draws the toolsets offered to one prompt from a distribution, reproducibly."""

from __future__ import annotations

import hashlib
import random

from ..distributions import Distribution


def sample_toolsets(prompt_id: str, dist: Distribution, unavailable: frozenset[str] = frozenset()) -> list[str]:
    """Each toolset is drawn independently with its probability; at least one is always chosen.

    The draw is seeded by the prompt id and the distribution name, so a retried or resumed
    prompt sees exactly the toolsets it saw the first time. Toolsets that cannot work in this run
    (`unavailable`: web with no provider) are drawn and then left out, so the others are drawn
    exactly as they would be with them.
    """
    seed = int.from_bytes(hashlib.sha256(f"{dist.name}\0{prompt_id}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    drawn = [name for name, pct in sorted(dist.toolsets.items()) if rng.random() * 100 < pct]
    chosen = [name for name in drawn if name not in unavailable]
    if not chosen:
        # the most likely toolset; ties go to the alphabetically first, so the choice is stable
        usable = [kv for kv in dist.toolsets.items() if kv[0] not in unavailable and kv[1] > 0]
        chosen = [min(usable, key=lambda kv: (-kv[1], kv[0]))[0]]
    return chosen
