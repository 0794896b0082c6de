"""Two runs of one dataset side by side (`view --run_name=a,b`), e.g. two models, or the runner's own
loop and the real Hermes Agent (`--agent`): each run's pass rate and pass@k, the prompts one solves
more often than the other, and the paired difference of their per-prompt pass rates with a 95 %
interval over prompts; and what drove each: its agent, system prompt, tools offered and model calls.

Prompts are matched by `prompt_id` (a row's id: the same row of the same dataset has the same id
in every run); a prompt scored in one run only is counted apart, never in the difference.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..export import ExportError, kept_records
from ..stats import Statistics, interval


@dataclass
class RunFigures:
    name: str
    stats: Statistics = field(default_factory=Statistics)
    agents: Counter[str] = field(default_factory=Counter)  # who drove each trajectory (metadata.agent)
    system_prompts: Counter[str] = field(default_factory=Counter)  # as the model was sent them
    tools: set[str] = field(default_factory=set)  # every tool offered to a trajectory

    def add(self, rec: dict[str, Any]) -> None:
        self.stats.add(rec)
        meta = rec.get("metadata") or {}
        self.agents[str(meta.get("agent") or "native")] += 1
        first = (rec.get("conversations") or [{}])[0]
        if first.get("from") == "system":
            self.system_prompts[str(first.get("content") or first.get("value") or "")] += 1
        self.tools.update(str(t) for t in meta.get("tools_offered") or [])

    @property
    def rates(self) -> dict[str, list[int]]:
        """Prompt id → [scored, passed], of the prompts with a scored sample."""
        return {pid: [t.scored, t.passed] for pid, t in self.stats.per_prompt.items() if t.scored}


def read_run(run_dir: Path) -> RunFigures:
    figures = RunFigures(run_dir.name)
    for rec in kept_records(run_dir):
        figures.add(rec)
    return figures


def _driver(r: RunFigures) -> dict[str, Any]:
    """What drove a run's trajectories: its agent, system prompt (the commonest), tools and calls."""
    prompt, uses = r.system_prompts.most_common(1)[0] if r.system_prompts else ("", 0)
    return {"agent": ", ".join(name for name, _ in r.agents.most_common()) or None,
            "system_prompt": {"sha256": hashlib.sha256(prompt.encode()).hexdigest()[:12], "chars": len(prompt),
                              "opening": prompt[:120], "distinct": len(r.system_prompts)} if uses else None,
            "tools_offered": sorted(r.tools),
            "model_calls_per_trajectory": round(r.stats.api_calls / r.stats.trajectories, 2)
            if r.stats.trajectories else None}


def comparison(a: RunFigures, b: RunFigures) -> dict[str, Any]:
    """What the two runs say, as JSON (also what the page shows)."""
    a_rates, b_rates = a.rates, b.rates
    common = sorted(set(a_rates) & set(b_rates))
    diffs = [a_rates[p][1] / a_rates[p][0] - b_rates[p][1] / b_rates[p][0] for p in common]
    ci, how = interval(diffs, bounds=(-1.0, 1.0))
    runs = []
    for r in (a, b):
        v = r.stats.verification() or {}
        s = r.stats.to_json()["samples"] or {}
        runs.append({"run": r.name, "model": None, "trajectories": r.stats.trajectories,
                     "pass": v.get("pass", 0), "fail": v.get("fail", 0), "error": v.get("error", 0),
                     "pass_rate": v.get("pass_rate"), "pass_rate_errors_as_fail": v.get("pass_rate_errors_as_fail"),
                     "pass@k": s.get("pass@k") or {}, "pass^k": s.get("pass^k") or {},
                     "prompts_scored": len(r.rates), **_driver(r)})
    a_tools, b_tools = set(runs[0]["tools_offered"]), set(runs[1]["tools_offered"])
    return {
        "runs": runs,
        "prompts_in_both": len(common),
        "only_in": {a.name: len(set(a_rates) - set(b_rates)), b.name: len(set(b_rates) - set(a_rates))},
        "wins": sum(d > 0 for d in diffs), "losses": sum(d < 0 for d in diffs), "ties": sum(d == 0 for d in diffs),
        "mean_difference": round(sum(diffs) / len(diffs), 4) if diffs else None,
        "difference_ci95": ci, "ci95_method": how,
        "per_prompt": [{"prompt_id": p, "a": a_rates[p], "b": b_rates[p]} for p in common],
        "same_system_prompt": (runs[0]["system_prompt"] or {}).get("sha256") == (runs[1]["system_prompt"] or {}).get("sha256"),
        "tools_only_in": {a.name: sorted(a_tools - b_tools), b.name: sorted(b_tools - a_tools)},
    }


def compare_runs(run_dirs: list[Path]) -> dict[str, Any]:
    if len(run_dirs) != 2:
        raise ExportError(f"--run_name=a,b compares two runs; {len(run_dirs)} given")
    a, b = (read_run(d) for d in run_dirs)
    result = comparison(a, b)
    for entry, run_dir in zip(result["runs"], run_dirs, strict=True):
        entry["model"] = _model_of(run_dir)
    return result


def _model_of(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "statistics.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None


def summary_lines(c: dict[str, Any]) -> list[str]:
    lines = []
    for r in c["runs"]:
        at_k = ", ".join(f"pass@{k} {v:.3f}" for k, v in r["pass@k"].items())
        rate = f"{100 * r['pass_rate']:.1f}%" if r["pass_rate"] is not None else "none scored"
        lines.append(f"{r['run']} ({r['model'] or '?'}): pass rate {rate} of {r['pass'] + r['fail']} scored"
                     + (f", {r['error']} could not be checked ({100 * r['pass_rate_errors_as_fail']:.1f}% counting "
                        "them as fails)" if r["error"] else "") + (f"; {at_k}" if at_k else ""))
    a, b = (r["run"] for r in c["runs"])
    if any(r["agent"] != "native" for r in c["runs"]) or not c["same_system_prompt"]:
        for r in c["runs"]:
            sp = r["system_prompt"]
            lines.append(f"  {r['run']}: agent {r['agent']}; system prompt "
                         + (f"{sp['chars']} characters ({sp['sha256']})" if sp else "none")
                         + f"; {len(r['tools_offered'])} tools offered; "
                         f"{r['model_calls_per_trajectory']} model calls a trajectory")
        for name, only in c["tools_only_in"].items():
            if only:
                lines.append(f"  tools only {name} offered: {', '.join(only)}")
    if c["mean_difference"] is None:
        lines.append("no prompt was scored in both runs: nothing to compare")
        return lines
    ci = c["difference_ci95"]
    lines.append(f"over the {c['prompts_in_both']} prompts scored in both: {a} passes more often on {c['wins']}, "
                 f"{b} on {c['losses']}, as often on {c['ties']}; mean difference {a} − {b} "
                 f"{c['mean_difference']:+.3f}" + (f" (95% interval {ci[0]:+.3f} to {ci[1]:+.3f})" if ci else ""))
    return lines


def write_page(c: dict[str, Any], output: Path) -> None:
    """One self-contained HTML file: the runs side by side and each prompt's pass rates."""
    a, b = (r["run"] for r in c["runs"])
    ks = sorted({k for r in c["runs"] for k in r["pass@k"]}, key=int)
    head = "".join(f"<th>{html.escape(r['run'])}</th>" for r in c["runs"])

    def row(label: str, cells: list[str]) -> str:
        return f"<tr><th>{html.escape(label)}</th>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    table = [row("model", [r["model"] or "?" for r in c["runs"]]),
             row("agent", [r["agent"] or "?" for r in c["runs"]]),
             row("system prompt", [f"{r['system_prompt']['chars']} characters ({r['system_prompt']['sha256']}): "
                                   f"{r['system_prompt']['opening']}…" if r["system_prompt"] else "none"
                                   for r in c["runs"]]),
             row("tools offered", [", ".join(r["tools_offered"]) or "none" for r in c["runs"]]),
             row("model calls a trajectory", [str(r["model_calls_per_trajectory"]) for r in c["runs"]]),
             row("pass rate", [f"{pct(r['pass_rate'])} of {r['pass'] + r['fail']}" for r in c["runs"]]),
             row("could not be checked", [str(r["error"]) for r in c["runs"]]),
             row("pass rate, those as fails", [pct(r["pass_rate_errors_as_fail"]) for r in c["runs"]])]
    table += [row(f"pass@{k}", [pct(r["pass@k"].get(k)) for r in c["runs"]]) for k in ks]
    prompts = "".join(
        f"<tr><td>{html.escape(p['prompt_id'])}</td><td>{p['a'][1]}/{p['a'][0]}</td><td>{p['b'][1]}/{p['b'][0]}</td></tr>"
        for p in c["per_prompt"])
    lines = "".join(f"<p>{html.escape(line)}</p>" for line in summary_lines(c))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(a)} vs {html.escape(b)}</title>"
            "<style>body{font:14px system-ui;margin:2em}td,th{padding:2px 10px;text-align:left}"
            "table{border-collapse:collapse;margin:1em 0}tr:nth-child(even){background:#f4f4f4}</style></head><body>"
            f"<h1>{html.escape(a)} vs {html.escape(b)}</h1><div id='summary'>{lines}</div>"
            f"<table id='runs'><tr><th></th>{head}</tr>{''.join(table)}</table>"
            f"<h2>Per prompt (passed/scored)</h2><table id='prompts'><tr><th>prompt</th>{head}</tr>{prompts}</table>"
            "</body></html>")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")

