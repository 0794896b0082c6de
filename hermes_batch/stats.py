"""Statistics over the merged dataset, so they stay true after any number of resumes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any


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
    cost: float | None = None
    llm_seconds: float = 0.0
    tool_seconds: float = 0.0
    wall_seconds: float = 0.0
    toolsets: Counter = field(default_factory=Counter)

    def add(self, rec: dict[str, Any]) -> None:
        meta = rec.get("metadata") or {}
        self.trajectories += 1
        self.completed += bool(rec.get("completed"))
        self.partial += bool(rec.get("partial"))
        self.api_calls += int(rec.get("api_calls") or 0)
        for tool, s in (rec.get("tool_stats") or {}).items():
            c = self.tools.setdefault(tool, Counter())
            for k in ("count", "success", "failure"):
                c[k] += int(s.get(k) or 0)
        self.assistant_turns += int(meta.get("assistant_turns") or 0)
        self.reasoning_turns += int(meta.get("reasoning_turns") or 0)
        self.stop_reasons[meta.get("stop_reason") or "unknown"] += 1
        usage = meta.get("usage") or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens") or 0)
        if usage.get("cost") is not None:
            self.cost = (self.cost or 0.0) + float(usage["cost"])
        self.llm_seconds += float(meta.get("llm_seconds") or 0)
        self.tool_seconds += float(meta.get("tool_seconds") or 0)
        self.wall_seconds += float((meta.get("timings") or {}).get("total_seconds") or 0)
        for ts in rec.get("toolsets_used") or []:
            self.toolsets[ts] += 1

    def state(self) -> dict[str, Any]:
        """Everything counted so far, as JSON: a later merge adds only what it appends."""
        # by hand: asdict() would rebuild each Counter from its (key, count) pairs, counting the pairs
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**state, "tools": {tool: dict(c) for tool, c in self.tools.items()},
                "stop_reasons": dict(self.stop_reasons), "toolsets": dict(self.toolsets)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Statistics:
        counters = {"stop_reasons": Counter(state["stop_reasons"]), "toolsets": Counter(state["toolsets"]),
                    "tools": {tool: Counter(c) for tool, c in state["tools"].items()}}
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
            "completed": self.completed,
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
                "cost": round(self.cost, 6) if self.cost is not None else None,
            },
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
                     + (f", cost {self.cost:.4f}" if self.cost is not None else ""))
        return lines
