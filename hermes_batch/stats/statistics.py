"""Statistics over the merged dataset, so they stay true after any number of resumes."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from ..record import fabricated_in_record
from ..record.reference import PADDING_ONLY
from .passk import PromptTally, summary, tally

# upper bounds (seconds) of the buckets check times are counted in: p50/p95 within a bucket's width
CHECK_SECONDS_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass
class Statistics:
    trajectories: int = 0
    completed: int = 0
    partial: int = 0
    api_calls: int = 0
    tools: dict[str, Counter] = field(default_factory=dict)
    assistant_turns: int = 0
    reasoning_turns: int = 0
    stop_reasons: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, served from the provider's prompt cache
    cost: float | None = None
    llm_seconds: float = 0.0
    tool_seconds: float = 0.0
    wall_seconds: float = 0.0
    toolsets: Counter = field(default_factory=Counter)
    verdicts: Counter = field(default_factory=Counter)  # pass, fail, error, skipped
    check_errors: Counter = field(default_factory=Counter)  # by the kind of check that could not say
    score_sum: float = 0.0  # over the scored (pass or fail) trajectories
    baseline_passed: int = 0  # checks that passed on the untouched starting state (--check_baseline)
    passed_tokens: int = 0
    passed_cost: float | None = None
    fabricated: int = 0  # trajectories with a reply that wrote a tool result no tool returned (record/fabrication.py)
    check_seconds: list[int] = field(default_factory=lambda: [0] * (len(CHECK_SECONDS_BUCKETS) + 1))
    per_prompt: dict[str, PromptTally] = field(default_factory=dict)  # --samples > 1: each prompt's verdicts
    token_trajectories: int = 0  # with token data (--tokens=exact)
    token_calls: int = 0
    token_segments: int = 0
    token_missing_logprobs: int = 0
    token_render_seconds: float = 0.0
    token_prefix_breaks: int = 0  # --tokens=record: prompts that did not extend the last call's ids
    token_calls_without_ids: int = 0  # --tokens=record: calls whose endpoint returned not all their ids
    token_calls_without_reply_ids: int = 0  # --tokens=record: of those, calls without even the reply's

    def add(self, rec: dict[str, Any]) -> None:
        meta = rec.get("metadata") or {}
        self.trajectories += 1
        self.completed += bool(rec.get("completed"))
        self.partial += bool(rec.get("partial"))
        self.api_calls += int(rec.get("api_calls") or 0)
        for tool, s in (rec.get("tool_stats") or {}).items():
            if tool in PADDING_ONLY and not s.get("count"):
                continue  # the Hermes Agent's tools a record names for its schema's sake (record/reference.py)
            c = self.tools.setdefault(tool, Counter())
            for k in ("count", "success", "failure"):
                c[k] += int(s.get(k) or 0)
        self.fabricated += fabricated_in_record(rec) > 0
        self.assistant_turns += int(meta.get("assistant_turns") or 0)
        self.reasoning_turns += int(meta.get("reasoning_turns") or 0)
        self.stop_reasons[meta.get("stop_reason") or "unknown"] += 1
        usage = meta.get("usage") or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens") or 0)
        self.cached_tokens += int(usage.get("cached_tokens") or 0)
        if usage.get("cost") is not None:
            self.cost = (self.cost or 0.0) + float(usage["cost"])
        self.llm_seconds += float(meta.get("llm_seconds") or 0)
        self.tool_seconds += float(meta.get("tool_seconds") or 0)
        self.wall_seconds += float((meta.get("timings") or {}).get("total_seconds") or 0)
        for ts in rec.get("toolsets_used") or []:
            self.toolsets[ts] += 1
        self._add_verdict(rec.get("verification") or {}, usage)
        tally(self.per_prompt, rec)
        tokens = rec.get("tokens")
        if isinstance(tokens, dict) and isinstance(tokens.get("calls"), list) and tokens["calls"]:
            try:
                segments, missing = int(tokens.get("segments") or 1), int(tokens.get("missing_logprobs") or 0)
                seconds = float(tokens.get("render_seconds") or 0)
                breaks, blind = int(tokens.get("prefix_breaks") or 0), int(tokens.get("calls_without_ids") or 0)
                mute = int(tokens.get("calls_without_reply_ids") or 0)
            except (TypeError, ValueError):  # an edited record: counted as having none
                return
            self.token_trajectories += 1
            self.token_calls += len(tokens["calls"])
            self.token_segments += max(1, segments)
            self.token_missing_logprobs += missing
            self.token_render_seconds += seconds
            self.token_prefix_breaks += breaks
            self.token_calls_without_ids += blind
            self.token_calls_without_reply_ids += mute

    def _add_verdict(self, verdict: dict[str, Any], usage: dict[str, Any]) -> None:
        status = verdict.get("status") or "skipped"  # records from before checks existed
        self.verdicts[status] += 1
        if status == "skipped":
            return
        self.baseline_passed += (verdict.get("baseline") or {}).get("status") == "pass"
        for check in verdict.get("checks") or []:
            if check.get("status") == "error":
                self.check_errors[check.get("kind") or "?"] += 1
        if status in ("pass", "fail") and verdict.get("score") is not None:
            self.score_sum += float(verdict["score"])
        if status == "pass":
            self.passed_tokens += int(usage.get("total_tokens") or 0)
            if usage.get("cost") is not None:
                self.passed_cost = (self.passed_cost or 0.0) + float(usage["cost"])
        self.check_seconds[bisect.bisect_left(CHECK_SECONDS_BUCKETS, float(verdict.get("seconds") or 0))] += 1

    def verification(self) -> dict[str, Any] | None:
        """The verdicts in figures; None when no trajectory was checked."""
        v = self.verdicts
        checked = v["pass"] + v["fail"] + v["error"]
        if not checked:
            return None
        scored = v["pass"] + v["fail"]
        return {
            "pass": v["pass"], "fail": v["fail"], "error": v["error"], "skipped": v["skipped"],
            "pass_rate": round(v["pass"] / scored, 4) if scored else None,  # errors are not failures
            # the other reading, side by side: what the rate would be were every error a fail
            "pass_rate_errors_as_fail": round(v["pass"] / checked, 4),
            "error_rate": round(v["error"] / checked, 4),
            "errors_by_check": dict(self.check_errors),
            "mean_score": round(self.score_sum / scored, 4) if scored else None,
            "tokens_per_pass": round(self.passed_tokens / v["pass"]) if v["pass"] else None,
            "cost_per_pass": round(self.passed_cost / v["pass"], 6) if v["pass"] and self.passed_cost is not None
            else None,
            "check_seconds_p50": self._check_seconds_quantile(0.5),
            "check_seconds_p95": self._check_seconds_quantile(0.95),
            "baseline_passed": self.baseline_passed,
        }

    def token_exact(self) -> dict[str, Any] | None:
        """How token-exact the run's data is; None when no trajectory has token data."""
        if not self.token_trajectories:
            return None
        return {"trajectories": self.token_trajectories, "share_of_trajectories": round(
                    self.token_trajectories / self.trajectories, 4),
                "model_calls": self.token_calls, "segments": self.token_segments,
                "new_segments": self.token_segments - self.token_trajectories,  # where the history was not extended
                "missing_logprobs": self.token_missing_logprobs,
                "share_of_calls_with_ids": round(1 - self.token_calls_without_ids / self.token_calls, 4)
                if self.token_calls else None,
                "share_of_calls_with_reply_ids": round(1 - self.token_calls_without_reply_ids / self.token_calls, 4)
                if self.token_calls else None,
                "prefix_breaks": self.token_prefix_breaks,  # --tokens=record: each one a new segment
                "render_seconds_per_call": round(self.token_render_seconds / self.token_calls, 4)
                if self.token_calls else None}

    def _check_seconds_quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile of check times."""
        total = sum(self.check_seconds)
        seen = 0
        for i, n in enumerate(self.check_seconds):
            seen += n
            if total and seen >= q * total:
                return CHECK_SECONDS_BUCKETS[i] if i < len(CHECK_SECONDS_BUCKETS) else float("inf")
        return None

    def state(self) -> dict[str, Any]:
        """Everything counted so far, as JSON: a later merge adds only what it appends."""
        # by hand: asdict() would rebuild each Counter from its (key, count) pairs, counting the pairs
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**state, "tools": {tool: dict(c) for tool, c in self.tools.items()},
                "stop_reasons": dict(self.stop_reasons), "toolsets": dict(self.toolsets),
                "verdicts": dict(self.verdicts), "check_errors": dict(self.check_errors),
                "check_seconds": list(self.check_seconds),
                "per_prompt": {pid: t.to_json() for pid, t in self.per_prompt.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Statistics:
        counters = {"stop_reasons": Counter(state["stop_reasons"]), "toolsets": Counter(state["toolsets"]),
                    "tools": {tool: Counter(c) for tool, c in state["tools"].items()},
                    # a state saved before checks existed counted none
                    "verdicts": Counter(state.get("verdicts") or {}), "check_errors": Counter(state.get("check_errors") or {}),
                    "per_prompt": {pid: PromptTally.from_json(t) for pid, t in (state.get("per_prompt") or {}).items()}}
        return cls(**{**state, **counters})

    def tool_table(self) -> dict[str, dict[str, Any]]:
        table = {}
        for tool, c in sorted(self.tools.items()):
            decided = c["success"] + c["failure"]
            table[tool] = {
                "count": c["count"], "success": c["success"], "failure": c["failure"],
                "success_rate": round(100 * c["success"] / decided, 2) if decided else 0.0,
                "failure_rate": round(100 * c["failure"] / decided, 2) if decided else 0.0,
            }
        return table

    def to_json(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "completed": self.completed,  # the agent stopped with an answer: no verdict (that is `verification`)
            "fabricated_tool_results": self.fabricated,
            "partial": self.partial,
            "api_calls": self.api_calls,
            "stop_reasons": dict(self.stop_reasons),
            "toolsets_offered": dict(self.toolsets),
            "tool_statistics": self.tool_table(),
            "reasoning_statistics": {
                "total_assistant_turns": self.assistant_turns,
                "turns_with_reasoning": self.reasoning_turns,
                "turns_without_reasoning": self.assistant_turns - self.reasoning_turns,
                "coverage_percent": round(100 * self.reasoning_turns / self.assistant_turns, 2) if self.assistant_turns else 0.0,
            },
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "total": self.prompt_tokens + self.completion_tokens,
                "cached": self.cached_tokens,
                "cache_hit_rate": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None,
                "cost": round(self.cost, 6) if self.cost is not None else None,
            },
            "verification": self.verification(),
            "samples": summary(self.per_prompt),
            "token_exact": self.token_exact(),
            "seconds": {
                "llm": round(self.llm_seconds, 2),
                "tools": round(self.tool_seconds, 2),
                "trajectory_wall_total": round(self.wall_seconds, 2),
            },
        }

    def summary_lines(self) -> list[str]:
        lines = []
        table = self.tool_table()
        used = {t: r for t, r in table.items() if r["count"]}
        if used:
            lines.append(f"{'tool':<14}{'calls':>8}{'ok':>8}{'failed':>8}{'ok %':>8}")
            for tool, r in used.items():
                lines.append(f"{tool:<14}{r['count']:>8}{r['success']:>8}{r['failure']:>8}{r['success_rate']:>8.1f}")
        cov = 100 * self.reasoning_turns / self.assistant_turns if self.assistant_turns else 0.0
        lines.append(f"reasoning coverage: {cov:.1f}% of {self.assistant_turns} assistant turns")
        lines.append(f"tokens: {self.prompt_tokens} prompt + {self.completion_tokens} completion"
                     + (f" ({self.cached_tokens} of the prompt tokens from the cache, "
                        f"{100 * self.cached_tokens / self.prompt_tokens:.1f}%)" if self.cached_tokens else "")
                     + (f", cost {self.cost:.4f}" if self.cost is not None else ""))
        t = self.token_exact()
        if t:
            lines.append(f"token-exact: {t['trajectories']} trajectories, {t['model_calls']} model calls, "
                         f"{t['new_segments']} new segments ({t['prefix_breaks']} prefix breaks), "
                         f"{t['missing_logprobs']} log-probabilities missing"
                         + (f", {100 * (1 - t['share_of_calls_with_ids']):.1f}% of calls without the prompt's "
                            f"or the reply's ids ({100 * (1 - t['share_of_calls_with_reply_ids']):.1f}% without "
                            "the reply's)" if t["share_of_calls_with_ids"] not in (None, 1.0) else "") + "; "
                         f"rendering {1000 * (t['render_seconds_per_call'] or 0):.1f} ms a call")
        lines.append(f"answered: {self.completed} of {self.trajectories} trajectories ended with a final answer "
                     "(`completed`: the agent stopped calling tools; it says nothing of whether the answer is right)")
        if self.fabricated:
            lines.append(f"fabricated tool results: {self.fabricated} trajectories hold a reply that wrote a tool's result "
                         "no tool returned (left out of training exports unless --keep_fabricated)")
        v = self.verification()
        if not v:
            lines.append("not verified: no trajectory of this run was checked (its rows have no check, expected answer "
                         "or rubric), so nothing here says whether any answer is right (docs/verification.md)")
        if v:
            rate = f"{100 * v['pass_rate']:.1f}% of {v['pass'] + v['fail']} scored" if v["pass_rate"] is not None else "none scored"
            lines.append(f"verified: {v['pass']} pass, {v['fail']} fail, {v['error']} could not be checked"
                         + (f" ({', '.join(f'{k}: {n}' for k, n in sorted(v['errors_by_check'].items()))})"
                            if v["errors_by_check"] else "")
                         + f"; pass rate {rate}"
                         + (f" ({100 * v['pass_rate_errors_as_fail']:.1f}% of {v['pass'] + v['fail'] + v['error']} "
                            "counting those as fails)" if v["error"] else "")
                         + (f", mean score {v['mean_score']:.3f}" if v["mean_score"] is not None else ""))
            per_pass = [f"{v['tokens_per_pass']} tokens"] if v["tokens_per_pass"] is not None else []
            if v["cost_per_pass"] is not None:
                per_pass.append(f"cost {v['cost_per_pass']:.4f}")
            lines.append((f"per passing trajectory: {', '.join(per_pass)}; " if per_pass else "")
                         + f"check time p50 ≤ {v['check_seconds_p50']:g} s, p95 ≤ {v['check_seconds_p95']:g} s")
            lines.extend(samples_lines(summary(self.per_prompt)))
            if self.baseline_passed:
                lines.append(f"warning: {self.baseline_passed} check(s) passed on the task's untouched starting state "
                             "(--check_baseline): they cannot tell right from wrong")
        return lines


def samples_lines(s: dict[str, Any] | None) -> list[str]:
    """The console's lines on several samples per prompt."""
    if not s or not s["pass@k"]:
        return []
    ci = s["pass@1_ci95"]
    lines = [f"samples: {s['samples_scored']} scored over {s['prompts_scored']} prompts"
             + (f", {s['samples_error']} could not be checked (left out)" if s["samples_error"] else "")
             + "; " + ", ".join(f"pass@{k} {v:.3f}" + (f" (over {s['pass@k_prompts'][k]})"
                                                        if s["pass@k_prompts"][k] < s["prompts_scored"] else "")
                                 for k, v in s["pass@k"].items())
             + (f" (pass@1 95% interval {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")]
    if s["samples_error"]:
        lines.append("with the samples that could not be checked as fails: "
                     + ", ".join(f"pass@{k} {v:.3f}" for k, v in s["pass@k_errors_as_fail"].items()))
    lines.append("all k pass: " + ", ".join(f"pass^{k} {v:.3f}" for k, v in s["pass^k"].items())
                 + (f"; majority vote right on {100 * s['majority_vote']['accuracy']:.1f}% of "
                    f"{s['majority_vote']['prompts']} prompts" if s["majority_vote"] else "")
                 + (f"; {s['mixed_prompts']} prompts ({100 * s['mixed_share']:.1f}%) both pass and fail"
                    if s["mixed_share"] is not None else ""))
    return lines
