"""Draws the toolsets offered to one prompt from a distribution, reproducibly."""

from __future__ import annotations

import hashlib
import random

from distributions import Distribution


def sample_toolsets(prompt_id: str, dist: Distribution) -> list[str]:
    """Each toolset is drawn independently with its probability; at least one is always chosen.

    The draw is seeded by the prompt id and the distribution name, so a retried or resumed
    prompt sees exactly the toolsets it saw the first time.
    """
    seed = int.from_bytes(hashlib.sha256(f"{dist.name}\0{prompt_id}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    chosen = [name for name, pct in sorted(dist.toolsets.items()) if rng.random() * 100 < pct]
    if not chosen:
        # the most likely toolset; ties go to the alphabetically first, so the choice is stable
        chosen = [min(dist.toolsets.items(), key=lambda kv: (-kv[1], kv[0]))[0]]
    return chosen
