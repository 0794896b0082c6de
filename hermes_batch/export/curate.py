"""Curation across the samples of a prompt, for `export`: which samples to keep (`--keep`), which
prompts (`--min_pass_rate`, `--max_pass_rate`), and preference pairs (`--format=preference`).

The run's records are read twice: once to learn, per prompt, its pass rate and which samples to
keep or pair (ids and numbers only), once to write them. Memory holds a few ids per sample, never
a trajectory, except a pair's first half until its other half comes (the merged file keeps the
samples of a prompt together, so that is a prompt's worth).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..record import prompt_id_of, sample_number

KEEPS = ("all", "passed", "best", "shortest")


@dataclass
class Curation:
    keep: str = "all"  # all | passed (every passing sample) | best (the highest score) | shortest (passing)
    min_pass_rate: float | None = None  # of the prompt's scored samples (errors left out)
    max_pass_rate: float | None = None
    pairs: bool = False  # preference pairs: a passing and a failing sample of one prompt

    @property
    def per_prompt(self) -> bool:
        return self.keep != "all" or self.min_pass_rate is not None or self.max_pass_rate is not None or self.pairs


@dataclass
class _Prompt:
    scored: int = 0
    passed: int = 0
    candidates: list[tuple[Any, str]] = field(default_factory=list)  # (sort key, id) of the samples kept by filters
    not_passed: int = 0  # samples the filters keep that --keep=passed|shortest leaves out
    # (the version of the checks that scored it, sample, id): a pair's verdicts come from the same checks
    passing: list[tuple[str, int, str]] = field(default_factory=list)
    failing: list[tuple[str, int, str]] = field(default_factory=list)


@dataclass
class Selection:
    keep: set[str] = field(default_factory=set)  # the ids to write
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (chosen id, rejected id)
    dropped: dict[str, int] = field(default_factory=dict)  # reason → samples left out by curation


def prompt_of(rec: dict[str, Any]) -> str:
    return prompt_id_of(rec)


def status_of(rec: dict[str, Any]) -> str:
    return (rec.get("verification") or {}).get("status") or "skipped"


def select(records: Iterable[dict[str, Any]], curation: Curation, drop_reason: Any) -> Selection:
    """The first read: what to keep (or pair), prompt by prompt. `drop_reason` is the export's
    filters; a sample they leave out still counts toward its prompt's pass rate."""
    prompts: dict[str, _Prompt] = {}
    for rec in records:
        p = prompts.setdefault(prompt_of(rec), _Prompt())
        status = status_of(rec)
        p.scored += status in ("pass", "fail")
        p.passed += status == "pass"
        if drop_reason(rec):
            continue
        score = (rec.get("verification") or {}).get("score")
        meta = rec.get("metadata") or {}
        shortness = (int(meta.get("assistant_turns") or 0), int((meta.get("usage") or {}).get("total_tokens") or 0))
        if curation.keep == "best":
            p.candidates.append(((-(score if score is not None else -1.0), *shortness, rec["id"]), rec["id"]))
        elif curation.keep in ("passed", "shortest") and status == "pass":
            p.candidates.append(((*shortness, rec["id"]), rec["id"]))
        elif curation.keep in ("passed", "shortest"):
            p.not_passed += 1
        elif curation.keep == "all":
            p.candidates.append(((), rec["id"]))
        version = str((rec.get("verification") or {}).get("check_version") or "")
        if status == "pass":
            p.passing.append((version, sample_number(rec), rec["id"]))
        elif status == "fail":
            p.failing.append((version, sample_number(rec), rec["id"]))
    out = Selection()

    def drop(reason: str, n: int) -> None:
        if n:
            out.dropped[reason] = out.dropped.get(reason, 0) + n

    for p in prompts.values():
        reason = _outside_window(p, curation)
        if reason:
            drop(reason, len(p.candidates) + p.not_passed)
            continue
        drop("not passed", p.not_passed)
        if curation.pairs:  # each sample in one pair at most, in sample order, both scored by the same checks
            for version in sorted({v for v, _, _ in p.passing} & {v for v, _, _ in p.failing}):
                good = sorted(x for x in p.passing if x[0] == version)
                bad = sorted(x for x in p.failing if x[0] == version)
                out.pairs.extend((g[2], b[2]) for g, b in zip(good, bad, strict=False))
            continue
        if not p.candidates:
            continue
        if curation.keep in ("best", "shortest"):
            out.keep.add(min(p.candidates)[1])
            drop(f"not the {curation.keep} of its prompt", len(p.candidates) - 1)
        else:
            out.keep.update(i for _, i in p.candidates)
    return out


def _outside_window(p: _Prompt, curation: Curation) -> str | None:
    if curation.min_pass_rate is None and curation.max_pass_rate is None:
        return None
    if not p.scored:
        return "prompt without a scored sample"
    rate = p.passed / p.scored
    if curation.min_pass_rate is not None and rate < curation.min_pass_rate:
        return f"prompt pass rate below {curation.min_pass_rate:g}"
    if curation.max_pass_rate is not None and rate > curation.max_pass_rate:
        return f"prompt pass rate above {curation.max_pass_rate:g}"
    return None


def paired(records: Iterable[dict[str, Any]], pairs: list[tuple[str, str]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The second read, for preference pairs: (chosen, rejected) records as both halves are read."""
    partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
    chosen = {a for a, _ in pairs}
    waiting: dict[str, dict[str, Any]] = {}
    for rec in records:
        other = partner.get(rec["id"])
        if other is None:
            continue
        if other not in waiting:
            waiting[rec["id"]] = rec
            continue
        first = waiting.pop(other)
        yield (rec, first) if rec["id"] in chosen else (first, rec)
