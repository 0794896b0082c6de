"""pass@k and its kin over a run's samples: the unbiased estimators, the per-prompt tally, the summary
statistics.json holds, and intervals by bootstrap (docs/verification.md)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..checks import normalised
from ..record import prompt_id_of, sample_number

BOOTSTRAP_RESAMPLES = 1000


BOOTSTRAP_MAX_PROMPTS = 2000  # above it the interval is the normal one (the mean of bounded rates)


HISTOGRAM_BINS = 10


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn from n (c of them passing) passes:
    1 − C(n−c, k)/C(n, k), unbiased (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all k samples drawn from n pass: C(c, k)/C(n, k)."""
    if c < k:
        return 0.0
    return math.prod((c - i) / (n - i) for i in range(k))


def ks_up_to(n: int) -> list[int]:
    """1, 2, 4, … up to n, and n itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks if not ks or ks[-1] == n else [*ks, n]


@dataclass
class PromptTally:
    """The verdicts of one prompt's samples, as counted so far."""

    scored: int = 0
    passed: int = 0
    errors: int = 0
    # the final answers of samples whose row has `expected`: normalised answer → [samples, passed]
    answers: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> list[Any]:
        return [self.scored, self.passed, self.errors, self.answers]

    @classmethod
    def from_json(cls, v: list[Any]) -> PromptTally:
        return cls(int(v[0]), int(v[1]), int(v[2]), {a: list(x) for a, x in (v[3] or {}).items()})


def tally(tallies: dict[str, PromptTally], rec: dict[str, Any]) -> None:
    """Count one sample's verdict under its prompt (every record: a run's first sample may have been
    written before --samples was raised)."""
    verdict = rec.get("verification") or {}
    status = verdict.get("status")
    if status not in ("pass", "fail", "error"):
        return
    t = tallies.setdefault(prompt_id_of(rec), PromptTally())
    if status == "error":
        t.errors += 1
        return
    t.scored += 1
    t.passed += status == "pass"
    answer = next((c for c in verdict.get("checks") or [] if c.get("kind") == "answer"), None)
    if answer is not None and answer.get("status") in ("pass", "fail"):
        sample = sample_number(rec)
        votes = t.answers.setdefault(normalised(str(answer.get("answer") or "")), [0, 0, sample])
        votes[0] += 1
        votes[1] = int(answer["status"] == "pass")
        votes[2:] = [min(votes[2] if len(votes) > 2 else sample, sample)]


def summary(tallies: dict[str, PromptTally]) -> dict[str, Any] | None:
    """The samples in figures, when some prompt ran more than once (else None); errors are left out of
    every rate and counted apart."""
    scored = {pid: t for pid, t in tallies.items() if t.scored}
    if not any(t.scored + t.errors > 1 for t in tallies.values()):
        return None
    most = max((t.scored for t in scored.values()), default=0)
    rates = [t.passed / t.scored for t in scored.values()]
    out: dict[str, Any] = {
        "prompts": len(tallies),
        "prompts_scored": len(scored),
        "samples_scored": sum(t.scored for t in scored.values()),
        "samples_error": sum(t.errors for t in tallies.values()),
        "pass@k": {}, "pass^k": {}, "pass@k_prompts": {}, "pass@k_errors_as_fail": {},
    }
    for k in ks_up_to(most):
        # over the prompts with at least k scored samples: one whose samples erred may count for fewer ks
        some = [t for t in scored.values() if t.scored >= k]
        out["pass@k"][str(k)] = round(sum(pass_at_k(t.scored, t.passed, k) for t in some) / len(some), 4)
        out["pass^k"][str(k)] = round(sum(pass_hat_k(t.scored, t.passed, k) for t in some) / len(some), 4)
        out["pass@k_prompts"][str(k)] = len(some)
        # the other reading: every sample that could not be checked a fail (the bracket's low end)
        every = [t for t in tallies.values() if t.scored + t.errors >= k]
        out["pass@k_errors_as_fail"][str(k)] = round(
            sum(pass_at_k(t.scored + t.errors, t.passed, k) for t in every) / len(every), 4) if every else None
    out["pass@1_ci95"], out["ci95_method"] = interval(rates)
    voted = [t for t in scored.values() if t.answers]
    out["majority_vote"] = ({"prompts": len(voted),
                             "accuracy": round(sum(majority_passes(t) for t in voted) / len(voted), 4)}
                            if voted else None)
    out["pass_rate_histogram"] = histogram(rates)
    mixed = sum(0 < r < 1 for r in rates)
    out["mixed_prompts"] = mixed
    out["mixed_share"] = round(mixed / len(rates), 4) if rates else None
    return out


def majority_passes(t: PromptTally) -> bool:
    """The answer most samples gave (a tie: the one the earliest sample gave) is right."""
    best = max(t.answers.values(), key=lambda v: (v[0], -(v[2] if len(v) > 2 else 0)))
    return bool(best[1])


def interval(rates: list[float], bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[list[float] | None, str | None]:
    """A 95 % interval of the mean of per-prompt figures (pass rates, or two runs' differences of
    them), resampling prompts."""
    if len(rates) < 2:
        return None, None
    mean = sum(rates) / len(rates)
    if len(rates) > BOOTSTRAP_MAX_PROMPTS:
        sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (len(rates) - 1))
        half = 1.96 * sd / math.sqrt(len(rates))
        return [round(max(bounds[0], mean - half), 4), round(min(bounds[1], mean + half), 4)], "normal"
    rng = random.Random(0)  # the same figures on every merge
    means = sorted(sum(rng.choices(rates, k=len(rates))) / len(rates) for _ in range(BOOTSTRAP_RESAMPLES))
    lo, hi = means[int(0.025 * BOOTSTRAP_RESAMPLES)], means[int(0.975 * BOOTSTRAP_RESAMPLES) - 1]
    return [round(lo, 4), round(hi, 4)], "bootstrap"


def histogram(rates: list[float]) -> dict[str, int]:
    """Prompts by pass rate: all failed, all passed, and tenths between (mixed outcomes are the
    ones reinforcement learning can learn from)."""
    counts: Counter[str] = Counter()
    for r in rates:
        if r == 0:
            counts["0"] += 1
        elif r == 1:
            counts["1"] += 1
        else:
            lo = min(int(r * HISTOGRAM_BINS), HISTOGRAM_BINS - 1) / HISTOGRAM_BINS
            counts[f"{lo:.1f}-{lo + 1 / HISTOGRAM_BINS:.1f}"] += 1
    order = ["0", *(f"{i / HISTOGRAM_BINS:.1f}-{(i + 1) / HISTOGRAM_BINS:.1f}" for i in range(HISTOGRAM_BINS)), "1"]
    return {b: counts[b] for b in order if counts[b]}
