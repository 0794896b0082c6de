"""A self-contained HTML report of a run: one file, no network, to look at trajectories before
training on them. A table (search; filters by verdict, completed, stop reason, toolset, tool errors),
each row opening into what its checks said and its turns (reasoning folded, tool calls with their arguments, tool output with
errors marked, the images a tool saw or made, tokens and timings), and the run's statistics as charts. `#open=<id>` in the URL
opens that trajectory."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..export import ExportError, kept_records
from ..flags import CommaList, Text, flag
from ..record import fabricated_in_record, image_file, is_image_ref, read_image, tool_results
from ..stats import Statistics
from ..store import run_name_checked
from ..util import clip, image_too_large


class ViewOptions(BaseModel):
    """The flags of `python batch_runner.py view` (a RunLocation's, but one run or two)."""

    model_config = ConfigDict(extra="forbid")

    run_name: CommaList = Field(..., description="the run, or two runs of one dataset to compare: a,b")
    output_dir: Text = flag("data", "root of run directories")
    output: Text | None = Field(None, description="the HTML file to write (default: <run dir>/report.html; "
                                                  "two runs: <output_dir>/compare-a-b.html)")
    limit: int = Field(2000, ge=1, description="trajectories in the page at most (the statistics count them all)")

    @field_validator("run_name")
    @classmethod
    def _run_names(cls, names: list[str]) -> list[str]:
        if not 1 <= len(names) <= 2:
            raise ValueError("one run, or two to compare (a,b)")
        return [run_name_checked(n) for n in names]

    @property
    def run_dirs(self) -> list[Path]:
        return [Path(self.output_dir) / name for name in self.run_name]

    @property
    def run_dir(self) -> Path:
        return self.run_dirs[0]

    @property
    def output_path(self) -> Path:
        if self.output:
            return Path(self.output)
        if len(self.run_dirs) > 1:
            return Path(self.output_dir) / f"compare-{'-'.join(d.name for d in self.run_dirs)}.html"
        return self.run_dir / "report.html"


TEXT_LIMIT = 6000  # characters of one turn kept in the page (head and tail)


def _clip(text: str | None) -> str:
    return clip(text or "", TEXT_LIMIT, " in this view")


def _tool_shown(result: dict[str, Any]) -> str:
    """A tool's result as a person reads it: a command's output as text, its exit code and error marked."""
    text = result.get("content") or ""
    if result.get("name") == "terminal":
        try:
            shown = json.loads(text)
        except ValueError:
            return text
        if isinstance(shown, dict) and {"output", "exit_code"} <= shown.keys():  # format 4 on
            out = str(shown["output"])
        elif isinstance(shown, dict) and {"exit_code", "stdout", "stderr"} <= shown.keys():  # before
            out = shown["stdout"] + (f"\n[stderr]\n{shown['stderr']}" if shown["stderr"] else "")
        else:
            return text
        if shown["exit_code"] != 0:
            out += f"\n[exit code {shown['exit_code']}]"
        return out + (f"\n[{shown['error']}]" if shown.get("error") else "")
    return text


def _failed(result: dict[str, Any]) -> bool:
    """What call_tool answers for a failed call: `{"error": ...}` (format 4 on) or `Error: ...` text."""
    text = result.get("content") or ""
    if text.startswith("Error"):
        return True
    try:
        shown = json.loads(text)
    except ValueError:
        return False
    return isinstance(shown, dict) and (shown.get("error") is not None or shown.get("success") is False)


def _at_a_word(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip() + "…"


class _Pictures:
    """The images a page shows, read from the run directory and put in the page (one file), until
    the page holds PAGE_IMAGE_BYTES of them; past that, and for one the run no longer holds as its
    record names it, a line saying which file it is."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.spent = run_dir, 0

    def shown(self, refs: Any) -> list[dict[str, str]]:
        out = []
        for ref in refs if isinstance(refs, list) else []:
            if not is_image_ref(ref):
                out.append({"note": "an image the record does not name properly"})
                continue
            name = image_file(ref)
            data = read_image(self.run_dir, ref) if self.spent + ref["bytes"] <= PAGE_IMAGE_BYTES else None
            if data is None:
                why = "not in the run directory as recorded" if self.spent + ref["bytes"] <= PAGE_IMAGE_BYTES \
                    else "not put in the page: it holds enough images"
                out.append({"note": f"image {name} ({ref['bytes']} bytes): {why}"})
                continue
            if large := image_too_large(data):  # the page would ask the browser to unpack it
                out.append({"note": f"image {name} ({ref['bytes']} bytes): not put in the page: {large}"})
                continue
            self.spent += len(data)
            out.append({"src": f"data:{ref['mime']};base64,{base64.b64encode(data).decode()}", "name": name})
        return out


PAGE_IMAGE_BYTES = 32 * 1024 * 1024


def _entry(rec: dict[str, Any], pictures: _Pictures) -> dict[str, Any]:
    meta = rec.get("metadata") or {}
    usage = meta.get("usage") or {}
    turns: list[dict[str, Any]] = []
    for t in rec.get("conversations") or []:
        if t.get("from") == "system":
            continue
        if t.get("from") == "tool":  # a result a box, each after the other
            turns.extend({"from": "tool", "value": _clip(_tool_shown(r)), "name": r.get("name"), "error": _failed(r),
                          "calls": [], "images": pictures.shown(r.get("images"))} for r in tool_results(t))
            continue
        turns.append({"from": t.get("from"), "value": _clip(t.get("value")), "name": t.get("name"), "error": False,
                      "calls": [{"name": c.get("name"), "arguments": _clip(c.get("arguments"))}
                                for c in t.get("tool_calls") or []],
                      "images": pictures.shown(t.get("images"))})
    prompt = next((t["value"] for t in turns if t["from"] == "human"), "")
    return {
        "id": rec.get("id"), "index": rec.get("prompt_index"), "prompt": _at_a_word(prompt, 300),
        "completed": bool(rec.get("completed")), "stop": meta.get("stop_reason") or "",
        "toolsets": rec.get("toolsets_used") or [], "turns": int(meta.get("assistant_turns") or 0),
        "calls": sum(int(s.get("count") or 0) for s in (rec.get("tool_stats") or {}).values()),
        "errors": sum(int(v or 0) for v in (rec.get("tool_error_counts") or {}).values()),
        "unknown": int(meta.get("unknown_tool_calls") or 0), "fabricated": fabricated_in_record(rec),
        "tokens": int(usage.get("total_tokens") or 0), "seconds": (meta.get("timings") or {}).get("total_seconds"),
        "llm_seconds": meta.get("llm_seconds"), "tool_seconds": meta.get("tool_seconds"),
        "model": meta.get("model"), "conversation": turns, **_verdict_shown(rec.get("verification") or {}),
    }


def _verdict_shown(v: dict[str, Any]) -> dict[str, Any]:
    """The record's verdict, and what each check said."""
    checks = []
    for c in v.get("checks") or []:
        lines = [f"{c.get('kind')}: {c.get('status')}" + (f", score {c['score']:g}" if c.get("score") is not None else "")
                 + (f", exit {c['exit_code']}" if c.get("exit_code") is not None else "")
                 + f" ({c.get('seconds') or 0:g} s" + (f", {c['attempts']} attempts)" if (c.get("attempts") or 1) > 1 else ")")]
        for key, label in (("error", "error"), ("answer", "answer"), ("expected", "expected"), ("explanation", "judge")):
            if c.get(key) is not None:
                value = c[key] if not isinstance(c[key], list) else " | ".join(map(str, c[key]))
                lines.append(f"{label}: {value}" + (f" ({c.get('match')})" if key == "expected" else ""))
        tests = c.get("tests")
        if tests:
            lines.append(f"tests: {tests.get('passed')} passed, {tests.get('failed')} failed, {tests.get('error')} errors, "
                         f"{tests.get('skipped')} skipped of {tests.get('total')}")
        for stream in ("stdout", "stderr"):
            if c.get(stream):
                lines.append(f"[{stream}]\n{c[stream]}")
        checks.append({"status": c.get("status"), "text": _clip("\n".join(lines))})
    return {"verdict": v.get("status") or "skipped", "score": v.get("score"), "checks": checks}


def build_report(run_dir: Path, limit: int) -> tuple[str, int, int]:
    """(the HTML, trajectories shown, trajectories in the run)."""
    stats = Statistics()
    shown: list[dict[str, Any]] = []
    total = 0
    pictures = _Pictures(run_dir)
    for rec in kept_records(run_dir):
        stats.add(rec)
        total += 1
        if len(shown) < limit:
            shown.append(_entry(rec, pictures))
    if not total:
        raise ExportError(f"{run_dir} holds no trajectories yet")
    data = {"run": run_dir.name, "total": total, "shown": len(shown), "stats": stats.to_json(), "rows": shown}
    # the run's data never becomes markup: no `<`, `>` or `&` inside <script> ("</script>" and
    # "<!--<script>" change how the page parses), each placeholder filled once and never re-read
    blob = json.dumps(data, ensure_ascii=False).translate(_SCRIPT_SAFE)
    fill = {"__TITLE__": html.escape(run_dir.name), "__DATA__": blob}
    page = re.sub("__TITLE__|__DATA__", lambda m: fill[m.group(0)], PAGE)
    return page, len(shown), total


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def write_report(run_dir: Path, output: Path, limit: int) -> tuple[int, int]:
    page, shown, total = build_report(run_dir, limit)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    return shown, total


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__ · hermes-batch</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
header{padding:12px 20px;background:#1d2733;color:#fff}header h1{font-size:18px;margin:0}
header .sub{opacity:.75;font-size:12px}main{display:grid;grid-template-columns:minmax(520px,1fr) 1fr;gap:12px;padding:12px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:10px;overflow:auto}
#charts{grid-column:1/3;display:flex;flex-wrap:wrap;gap:16px}.chart h3{font-size:13px;margin:0 0 4px}
.controls{display:flex;flex-wrap:wrap;gap:6px;margin-bottom:8px}input,select{font:inherit;padding:3px 6px}
table{border-collapse:collapse;width:100%}th,td{padding:4px 6px;border-bottom:1px solid #eef1f4;text-align:left;vertical-align:top}
th{position:sticky;top:0;background:#fff;font-size:12px;color:#5b6b7c}tr.traj{cursor:pointer}tr.traj:hover{background:#f0f5ff}
tr.sel{background:#e2ecff}.bad{color:#b3261e;font-weight:600}.ok{color:#1e7b34}.muted{color:#7a8795;font-size:12px}
.turn{border-left:3px solid #cfd6de;margin:8px 0;padding:4px 8px}.turn.human{border-color:#3b6fd8}.turn.gpt{border-color:#1e7b34}
.turn.tool{border-color:#8a6d00}.turn.tool.err{border-color:#b3261e;background:#fff4f3}.who{font-size:12px;font-weight:600;color:#5b6b7c}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:12px/1.35 ui-monospace,monospace;background:#f7f8fa;padding:6px;border-radius:4px}
details summary{cursor:pointer;color:#5b6b7c;font-size:12px}.call{background:#eef7ee}.turn.check{border-color:#6b4fbb}img.shot{display:block;max-width:100%;max-height:480px;margin:4px 0;border:1px solid #dde2e8}.turn.check.bad{background:#fff4f3}#errors{color:#b3261e}
</style></head><body>
<header><h1>__TITLE__</h1><div class="sub" id="summary"></div></header>
<div id="errors"></div>
<main>
<section id="charts"></section>
<section><div class="controls">
<input id="q" type="search" placeholder="search prompt or id" size="24">
<select id="f-completed"><option value="">answer: any</option><option value="yes">stopped with an answer</option><option value="no">no answer</option></select>
<select id="f-stop"><option value="">stop reason: any</option></select>
<select id="f-toolset"><option value="">toolset: any</option></select>
<select id="f-verdict"><option value="">verdict: any</option><option>pass</option><option>fail</option><option>error</option><option value="skipped">not checked</option></select>
<select id="f-errors"><option value="">tool errors: any</option><option value="yes">with tool errors</option><option value="no">no tool errors</option></select>
<span class="muted" id="count"></span></div>
<table><thead><tr><th>#</th><th>prompt</th><th>verdict</th><th title="the agent stopped with a final answer (completed): not a verdict">answered</th><th>stop</th><th>turns</th><th>calls</th><th>errors</th><th>tokens</th><th>s</th></tr></thead>
<tbody id="rows"></tbody></table></section>
<section id="detail"><p class="muted">Open a trajectory from the table.</p></section>
</main>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
window.addEventListener("error", e => { document.getElementById("errors").textContent += "error: " + e.message + "\n"; });
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = id => document.getElementById(id);
function el(tag, attrs, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) { if (k === "class") n.className = v; else n.setAttribute(k, v); }
  for (const k of kids) n.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return n;
}
function bars(title, pairs, fmt) {
  const w = 300, bh = 16, max = Math.max(1, ...pairs.map(p => p[1]));
  const ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", Math.max(bh, pairs.length * (bh + 4)));
  pairs.forEach(([label, v, extra], i) => {
    const y = i * (bh + 4), r = document.createElementNS(ns, "rect");
    r.setAttribute("x", 110); r.setAttribute("y", y); r.setAttribute("height", bh);
    r.setAttribute("width", Math.max(1, (w - 170) * v / max)); r.setAttribute("fill", "#3b6fd8"); svg.append(r);
    const t1 = document.createElementNS(ns, "text"); t1.setAttribute("x", 0); t1.setAttribute("y", y + 12);
    t1.setAttribute("font-size", 11); t1.textContent = String(label).slice(0, 16); svg.append(t1);
    const t2 = document.createElementNS(ns, "text"); t2.setAttribute("x", 114 + (w - 170) * v / max); t2.setAttribute("y", y + 12);
    t2.setAttribute("font-size", 11); t2.textContent = fmt ? fmt(v, extra) : v; svg.append(t2);
  });
  return el("div", {class: "chart"}, el("h3", {}, title), svg);
}
function histogram(values) {
  const counts = new Map();
  values.forEach(v => counts.set(v, (counts.get(v) || 0) + 1));
  return [...counts.entries()].sort((a, b) => a[0] - b[0]);
}
function bucket(v, size) { return Math.floor(v / size) * size; }
function charts() {
  const s = DATA.stats, tools = Object.entries(s.tool_statistics || {}).filter(([, t]) => t.count > 0);
  const box = $("charts");
  box.append(bars("tool calls (success rate)", tools.map(([n, t]) => [n, t.count, t.success_rate]),
                  (v, rate) => `${v} (${rate}%)`));
  box.append(bars("stop reasons", Object.entries(s.stop_reasons || {})));
  if (s.verification) box.append(bars("verdicts", ["pass", "fail", "error", "skipped"].map(k => [k, s.verification[k]])));
  if (s.samples && Object.keys(s.samples["pass@k"]).length) {
    box.append(bars("pass@k (pass^k)", Object.entries(s.samples["pass@k"]).map(([k, v]) => [`k=${k}`, Math.round(1000 * v) / 10, s.samples["pass^k"][k]]),
                    (v, all) => `${v}% (${Math.round(1000 * all) / 10}%)`));
    box.append(bars("prompts by pass rate", Object.entries(s.samples.pass_rate_histogram)));
  }
  box.append(bars("assistant turns per trajectory", histogram(DATA.rows.map(r => r.turns))));
  const size = Math.max(100, Math.ceil(Math.max(0, ...DATA.rows.map(r => r.tokens)) / 8 / 100) * 100);
  box.append(bars(`tokens per trajectory (buckets of ${size})`, histogram(DATA.rows.map(r => bucket(r.tokens, size)))));
}
function fillSelect(id, values) {
  const s = $(id);
  [...new Set(values)].sort().forEach(v => s.append(el("option", {value: v}, v)));
}
function visible(r) {
  const q = $("q").value.toLowerCase(), c = $("f-completed").value, st = $("f-stop").value,
        ts = $("f-toolset").value, er = $("f-errors").value, vd = $("f-verdict").value;
  if (q && !(r.prompt.toLowerCase().includes(q) || r.id.includes(q))) return false;
  if (c && (c === "yes") !== r.completed) return false;
  if (st && r.stop !== st) return false;
  if (ts && !r.toolsets.includes(ts)) return false;
  if (er && (er === "yes") !== (r.errors > 0)) return false;
  if (vd && r.verdict !== vd) return false;
  return true;
}
const VERDICT_CLASS = {pass: "ok", fail: "bad", error: "muted", skipped: "muted"};
function atWord(text, n) {  // a prompt in the table ends at a word, not in the middle of one
  if (text.length <= n) return text;
  const cut = text.lastIndexOf(" ", n);
  return text.slice(0, cut > n / 2 ? cut : n).trimEnd() + "…";
}
function table() {
  const body = $("rows"); body.textContent = "";
  const rows = DATA.rows.filter(visible);
  for (const r of rows) {
    const tr = el("tr", {class: "traj", "data-id": r.id},
      el("td", {}, r.index), el("td", {class: "prompt"}, atWord(r.prompt, 90)),
      el("td", {class: `verdict ${VERDICT_CLASS[r.verdict] || ""}`}, (r.verdict === "skipped" ? "not checked" : r.verdict) +
        (r.score !== null && r.verdict !== "pass" ? ` ${r.score}` : "")),
      el("td", {}, (r.completed ? "yes" : "no") + (r.fabricated ? " (fabricated tool result)" : "")), el("td", {}, r.stop),
      el("td", {}, r.turns), el("td", {}, r.calls), el("td", {class: r.errors ? "bad" : ""}, r.errors),
      el("td", {}, r.tokens), el("td", {}, r.seconds ?? ""));
    tr.addEventListener("click", () => open_(r.id));
    body.append(tr);
  }
  $("count").textContent = `${rows.length} of ${DATA.shown} shown`;
}
function open_(id) {
  const r = DATA.rows.find(x => x.id === id); if (!r) return;
  document.querySelectorAll("tr.sel").forEach(t => t.classList.remove("sel"));
  const tr = document.querySelector(`tr[data-id="${CSS.escape(id)}"]`); if (tr) tr.classList.add("sel");
  const d = $("detail"); d.textContent = "";
  d.append(el("h2", {id: "detail-id"}, r.id),
    el("p", {class: "muted"}, `prompt ${r.index} · ${r.model} · ${r.completed ? "stopped with an answer" : "stopped without an answer"} (${r.stop}) · ` +
      `verdict: ${r.verdict === "skipped" ? "not checked" : r.verdict} · ` +
      (r.fabricated ? `${r.fabricated} replies wrote a tool result no tool returned · ` : "") +
      `${r.turns} turns · ${r.calls} tool calls, ${r.errors} errors, ${r.unknown} unknown · ${r.tokens} tokens · ` +
      `${r.seconds ?? "?"} s (model ${r.llm_seconds ?? "?"} s, tools ${r.tool_seconds ?? "?"} s) · toolsets ${r.toolsets.join(", ")}`));
  for (const c of r.checks) {
    d.append(el("div", {class: `turn check ${c.status === "fail" ? "bad" : ""}`},
      el("div", {class: "who"}, `check: ${c.status}`), el("pre", {}, c.text)));
  }
  for (const t of r.conversation) {
    const box = el("div", {class: `turn ${t.from}`});
    if (t.from === "gpt") {
      const m = /^<think>([^]*?)<\/think>\s*/.exec(t.value);
      box.append(el("div", {class: "who"}, "assistant"));
      if (m && m[1].trim()) box.append(el("details", {}, el("summary", {}, "reasoning"), el("pre", {}, m[1].trim())));
      const text = (m ? t.value.slice(m[0].length) : t.value).replace(/<tool_call>[^]*?<\/tool_call>/g, "").trim();
      if (text) box.append(el("pre", {}, text));
      for (const c of t.calls) box.append(el("pre", {class: "call"}, `→ ${c.name}(${c.arguments})`));
    } else if (t.from === "tool") {
      if (t.error) box.classList.add("err");
      box.append(el("div", {class: "who"}, `tool result: ${t.name || ""}`), el("pre", {}, t.value));
      for (const p of t.images) {
        if (!p.src) { box.append(el("div", {class: "muted"}, p.note)); continue; }
        const img = el("img", {class: "shot", src: p.src, alt: p.name, title: p.name});
        img.addEventListener("load", () => { img.title = `${img.naturalWidth}×${img.naturalHeight} · ${p.name}`; });
        box.append(img);
      }
    } else {
      box.append(el("div", {class: "who"}, "user"), el("pre", {}, t.value));
    }
    d.append(box);
  }
}
$("summary").textContent = `${DATA.total} trajectories` + (DATA.shown < DATA.total ? ` (first ${DATA.shown} shown)` : "") +
  ` · ${DATA.stats.completed} stopped with an answer · ${DATA.stats.api_calls} model calls · ${DATA.stats.tokens.total} tokens` +
  (DATA.stats.verification ? "" : " · not verified: no trajectory was checked, so nothing here says whether an answer is right") +
  (DATA.stats.fabricated_tool_results ? ` · ${DATA.stats.fabricated_tool_results} with a fabricated tool result` : "") +
  (DATA.stats.verification && DATA.stats.verification.pass_rate !== null
    ? ` · pass rate ${(100 * DATA.stats.verification.pass_rate).toFixed(1)}% of ${DATA.stats.verification.pass + DATA.stats.verification.fail} checked` +
      (DATA.stats.verification.error ? ` (${(100 * DATA.stats.verification.pass_rate_errors_as_fail).toFixed(1)}% with the ${DATA.stats.verification.error} that could not be checked as fails)` : "") : "") +
  (DATA.stats.samples && Object.keys(DATA.stats.samples["pass@k"]).length
    ? ` · ${Object.entries(DATA.stats.samples["pass@k"]).map(([k, v]) => `pass@${k} ${(100 * v).toFixed(1)}%`).join(", ")} over ${DATA.stats.samples.prompts_scored} prompts` : "");
fillSelect("f-stop", DATA.rows.map(r => r.stop));
fillSelect("f-toolset", DATA.rows.flatMap(r => r.toolsets));
["q", "f-completed", "f-stop", "f-toolset", "f-errors", "f-verdict"].forEach(id => $(id).addEventListener("input", table));
charts(); table();
const want = /^#open=(.+)$/.exec(location.hash); if (want) open_(decodeURIComponent(want[1]));
</script></body></html>
"""
