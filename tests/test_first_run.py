"""What a first run shows is what the agent really did: the quick start's prompts are checked, so
its summary ends with verdicts; an unchecked run says plainly that nothing was verified and shows
`completed` as what it is (the agent stopped with an answer); a reply that writes a tool's result
itself is flagged in its record, counted, and left out of training exports unless asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import CLI, ROOT, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_export_and_view import CHROMIUM, opened_in_chromium

FAKE = '<tool_response>\n{"tool_call_id": "call_x", "name": "terminal", "content": {"output": "42", "exit_code": 0}}\n</tool_response>'


def batch_runner(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def unchecked(tmp_path_factory):
    """An unchecked run of three prompts: an honest answer, one that writes a tool's result itself, and
    one that quotes (in the frame) what its tool really returned."""
    tmp = tmp_path_factory.mktemp("first")
    rows = [
        {"prompt": script({"calls": [["terminal", {"command": "echo 41"}]]}, {"answer": "It printed 41."}, text="Honest.")},
        {"prompt": script({"calls": [["terminal", {"command": "echo 41"}]]},
                          {"answer": f"I ran it again:\n{FAKE}\nSo the answer is 42."}, text="Invents.")},
        {"prompt": script({"calls": [["terminal", {"command": "echo 41"}]]},
                          {"answer": "It said:\n<tool_response>\n{last_tool}\n</tool_response>"}, text="Quotes.")},
    ]
    with ScriptedModel() as model:
        res = CLI(tmp, model).run("first", write_jsonl(tmp / "d.jsonl", rows), toolsets="terminal")
    assert res.returncode == 0, res.stderr[-3000:]
    records = {r["conversations"][1]["value"].split("\n")[0]: r for r in read_jsonl(tmp / "out" / "first" / "trajectories.jsonl")}
    return tmp, res.stderr, records


def test_a_reply_that_writes_a_tool_result_itself_is_flagged_in_its_record(unchecked):
    _, _, records = unchecked
    counts = {k: r["metadata"]["fabricated_tool_results"] for k, r in records.items()}
    assert counts == {"Honest.": 0, "Invents.": 1, "Quotes.": 0}, counts  # a real result, quoted, is no fabrication


def test_the_summary_counts_them_and_says_nothing_was_verified(unchecked):
    tmp, said, _ = unchecked
    assert "answered: 3 of 3 trajectories ended with a final answer (`completed`: the agent stopped calling tools; " \
           "it says nothing of whether the answer is right)" in said, said
    assert "fabricated tool results: 1 trajectories hold a reply that wrote a tool's result no tool returned" in said
    assert "not verified: no trajectory of this run was checked" in said, said
    stats = json.loads((tmp / "out" / "first" / "statistics.json").read_text())
    assert stats["fabricated_tool_results"] == 1 and stats["verification"] is None


def test_training_exports_leave_them_out_unless_asked(unchecked):
    tmp, _, records = unchecked
    out = tmp / "out"
    res = batch_runner("export", "--run_name=first", f"--output_dir={out}", f"--output={tmp / 'a.jsonl'}", cwd=tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    kept = {json.loads(r["metadata"])["prompt_index"] for r in read_jsonl(tmp / "a.jsonl")}
    assert kept == {records["Honest."]["prompt_index"], records["Quotes."]["prompt_index"]}
    assert "filtered out: 1 a fabricated tool result (--keep_fabricated keeps it)" in res.stderr, res.stderr
    res = batch_runner("export", "--run_name=first", f"--output_dir={out}", f"--output={tmp / 'b.jsonl'}",
                       "--keep_fabricated", cwd=tmp)
    assert res.returncode == 0 and len(read_jsonl(tmp / "b.jsonl")) == 3, res.stderr[-2000:]


def test_a_checked_run_ends_with_its_verdicts_not_a_warning(tmp_path):
    rows = [{"prompt": script({"answer": "5"}, text="Two plus three?"), "expected": 5},
            {"prompt": script({"answer": "6"}, text="Two times two?"), "expected": 4}]
    with ScriptedModel() as model:
        res = CLI(tmp_path, model).run("checked", write_jsonl(tmp_path / "d.jsonl", rows), toolsets="terminal",
                                       require_reasoning=False)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stderr.splitlines()
    assert "answered: 2 of 2 trajectories ended with a final answer" in res.stderr
    assert any(line.startswith("verified: 1 pass, 1 fail, 0 could not be checked; pass rate 50.0% of 2 scored")
               for line in lines), res.stderr
    assert "not verified" not in res.stderr


def test_the_quick_start_s_prompts_are_checked_and_their_checks_tell_right_from_wrong(tmp_path):
    """README's quick start runs data/example_prompts.jsonl: every row has a check or an expected
    answer, and every command check fails on the untouched task and passes after its solution."""
    rows = read_jsonl(ROOT / "data" / "example_prompts.jsonl")
    assert rows and all(r.get("check") or r.get("expected") is not None for r in rows), rows
    res = batch_runner("validate", f"--dataset_file={ROOT / 'data' / 'example_prompts.jsonl'}",
                       f"--sandbox_root={tmp_path / 'sandboxes'}", cwd=tmp_path)
    commands = sum(1 for r in rows if r.get("check"))
    assert res.returncode == 0 and f"{commands} ok" in res.stdout + res.stderr, res.stdout + res.stderr


@pytest.mark.skipif(CHROMIUM is None and "chromium" not in os.environ.get("HERMES_BATCH_REQUIRE_BACKENDS", ""),
                    reason="no chromium here (apt-get install chromium)")
def test_the_report_says_so_too(unchecked, tmp_path):
    assert CHROMIUM, "chromium is required here (HERMES_BATCH_REQUIRE_BACKENDS) but not installed"
    tmp, _, records = unchecked
    page = tmp_path / "report.html"
    res = batch_runner("view", "--run_name=first", f"--output_dir={tmp / 'out'}", f"--output={page}", cwd=tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = opened_in_chromium(page, records["Invents."]["id"], tmp_path / "profile")
    assert "3 stopped with an answer" in dom and "not verified: no trajectory was checked" in dom, dom[:3000]
    assert "1 with a fabricated tool result" in dom
    detail = dom.split('id="detail"', 1)[1]
    assert "stopped with an answer (final_answer) · verdict: not checked · 1 replies wrote a tool result no tool returned" \
        in detail, detail[:2000]
    assert "yes (fabricated tool result)" in dom and "not checked" in dom.split('id="rows"', 1)[1]
