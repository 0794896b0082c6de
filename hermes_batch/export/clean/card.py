"""The dataset card every export writes beside its output, in the Hugging Face layout (a README.md
with YAML front matter, which `huggingface_hub.DatasetCard` reads): where the data came from (runs,
models, toolsets, backends, dates), its verdicts and pass rate, and what cleaning ran and what it
removed or masked. The front matter's `hermes_batch` block holds the same figures for a program.

It is written beside the output, `<output without its suffix>.README.md` (train.jsonl:
train.README.md; a directory `sessions`: sessions.README.md), never a README.md a folder already
has and never inside a directory of rows; `--push_to_hub` uploads it as the repository's README.md."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import __version__
from .cleaner import CleaningReport

STATUSES = ("pass", "fail", "error", "skipped")


@dataclass
class Provenance:
    """Where each written trajectory came from (a few fields each, never a trajectory)."""

    rows: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def add(self, rec: dict[str, Any], key: str | None = None) -> None:
        meta = rec.get("metadata") or {}
        verdict = rec.get("verification") or {}
        self.rows[key or str(rec["id"])] = (
            meta.get("run_name"), meta.get("model"), meta.get("backend"), verdict.get("status") or "skipped",
            verdict.get("score"), meta.get("timestamp"), tuple(rec.get("toolsets_used") or ()))

    def remove(self, key: str) -> None:
        self.rows.pop(key, None)

    def summary(self) -> dict[str, Any]:
        rows = list(self.rows.values())
        verdicts = Counter(r[3] for r in rows)
        scored = verdicts["pass"] + verdicts["fail"]
        stamps = sorted(str(r[5]) for r in rows if r[5])
        return {"trajectories": len(rows),
                "runs": sorted({str(r[0]) for r in rows if r[0]}),
                "models": dict(Counter(str(r[1]) for r in rows if r[1]).most_common()),
                "backends": dict(Counter(str(r[2]) for r in rows if r[2]).most_common()),
                "toolsets": dict(Counter(t for r in rows for t in r[6]).most_common()),
                "first_timestamp": stamps[0] if stamps else None, "last_timestamp": stamps[-1] if stamps else None,
                "verdicts": {s: verdicts[s] for s in STATUSES},
                "pass_rate": round(verdicts["pass"] / scored, 4) if scored else None,
                "pass_rate_errors_as_fails": round(verdicts["pass"] / (scored + verdicts["error"]), 4)
                if scored + verdicts["error"] else None}


def card_path(output: Path) -> Path:
    return output.with_name(f"{output.stem if output.suffix else output.name}.README.md")


def _size(n: int) -> str:
    for top, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < top:
            return name
    return "1M<n<10M"


def write_card(output: Path, fmt: str, rows_written: int, provenance: Provenance, cleaning: CleaningReport,
               sources: list[str], pairs: bool) -> Path:
    """The card for an export of `rows_written` rows of `fmt`; its path."""
    facts = provenance.summary()
    c = cleaning.cleaning
    cleaning_facts: dict[str, Any] = {
        "run_keys_masked": cleaning.masked.get("run_api_key", 0),
        "dedup": None if c.dedup == "off" else {
            "mode": c.dedup, "threshold": c.threshold if c.dedup == "near" else None, "scope": c.scope,
            "keep": c.keep, "surveyed": cleaning.surveyed, "removed": sum(cleaning.duplicates[k] for k in ("exact", "near")),
            **{k.replace(" ", "_"): cleaning.duplicates[k] for k in ("exact", "near", "within a prompt", "across prompts")}},
        "decontamination": None if not c.benchmarks else {
            "ngram": c.ngram, "action": c.contaminated, "benchmarks": cleaning.benchmarks,
            "contaminated": dict(cleaning.contaminated), "surveyed": cleaning.surveyed},
        "scrub": {"kinds": list(c.scrub), "rows_masked": cleaning.rows_masked,
                  "masked": {k: cleaning.masked[k] for k in sorted(cleaning.masked)},
                  "token_rows_not_exact": cleaning.not_token_exact},
    }
    front = {
        "pretty_name": f"hermes-batch trajectories ({', '.join(facts['runs']) or 'export'})",
        "tags": ["agent-trajectories", "tool-use", "synthetic", "hermes-batch"],
        "task_categories": ["text-generation"],
        "size_categories": [_size(rows_written)],
        "hermes_batch": {"version": __version__, "format": fmt, "rows": rows_written, "pairs": pairs,
                         "runs_named": sources, **facts, "cleaning": cleaning_facts},
    }
    path = card_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"---\n{_yaml(front)}---\n\n{_body(output, fmt, rows_written, facts, cleaning_facts, pairs)}"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def _yaml(data: dict[str, Any]) -> str:
    try:
        import yaml
    except ImportError:  # JSON is YAML too
        return json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000))


def _body(output: Path, fmt: str, rows: int, facts: dict[str, Any], cleaning: dict[str, Any], pairs: bool) -> str:
    v = facts["verdicts"]
    rate = f"pass rate {facts['pass_rate']:.1%} of the scored ones" if facts["pass_rate"] is not None \
        else "none scored"
    lines = [
        f"# {output.name}", "",
        f"Agent trajectories written by hermes-batch {__version__} with `export --format={fmt}`: "
        f"{rows} {'preference pairs' if pairs else 'rows'} from {facts['trajectories']} trajectories.", "",
        "## Source", "",
        f"- runs: {', '.join(facts['runs']) or 'unnamed'}",
        f"- models: {_counted(facts['models'])}",
        f"- toolsets offered: {_counted(facts['toolsets'])}",
        f"- sandbox backends: {_counted(facts['backends'])}",
        f"- written between {facts['first_timestamp'] or '?'} and {facts['last_timestamp'] or '?'}", "",
        "## Verdicts", "",
        f"{v['pass']} pass, {v['fail']} fail, {v['error']} could not be checked, {v['skipped']} without a check; "
        f"{rate}. Each row carries its verdict (docs/verification.md).", "",
        "## Cleaning", "",
    ]
    lines.append(f"- The run's own API keys: {cleaning['run_keys_masked']} found and masked as `<SECRET:run_api_key>` "
                 "(always done).")
    d = cleaning["dedup"]
    lines.append("- Duplicates: not looked for." if d is None else
                 f"- Duplicates ({d['mode']}" + (f", MinHash Jaccard ≥ {d['threshold']}" if d["threshold"] else "")
                 + f", scope {d['scope']}, keeping the {d['keep']} one): {d['removed']} removed of {d['surveyed']} "
                 f"({d['exact']} exact, {d['near']} near; {d['within_a_prompt']} within a prompt, "
                 f"{d['across_prompts']} across prompts).")
    t = cleaning["decontamination"]
    if t is None:
        lines.append("- Benchmark contamination: not checked.")
    else:
        names = ", ".join(f"{b['source']} ({b['items']} items, sha256 {b['content_sha256'][:12]})" for b in t["benchmarks"])
        found = sum(t["contaminated"].values())
        lines.append(f"- Benchmark contamination ({t['ngram']}-gram overlap of prompts, tool results, replies and "
                     f"call arguments) against {names}: {found} rows "
                     f"{'removed' if t['action'] == 'drop' else 'kept and flagged in their metadata'}.")
    s = cleaning["scrub"]
    kinds = ", ".join(f"{n} {k}" for k, n in s["masked"].items() if k != "run_api_key") or "none"
    lines.append(f"- Secrets and personal data ({', '.join(s['kinds']) or 'not scrubbed'}): {s['rows_masked']} rows "
                 f"masked; values masked: {kinds}; {s['token_rows_not_exact']} token rows re-tokenised where masked "
                 "(no longer token-exact).")
    lines += ["", "What these steps cannot catch: a secret of no known shape (a password in prose), names and street "
              "addresses, a benchmark paraphrased or translated, or quoted in fewer words than the n-gram; "
              "near-duplicates whose actions differ in more than the threshold allows. See docs/export.md.", ""]
    return "\n".join(lines)


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} ({n})" for k, n in counts.items()) or "not recorded"
