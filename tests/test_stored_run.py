"""A run written by an earlier version (tests/stored_runs/main-2026-12-01, made by
tests/stored_runs/make_stored_run.py on main of that day, before records had a format version)
exports to the same bytes and resumes where it stopped: nothing it holds is done again or changed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_batch.record import FORMAT
from tests.conftest import ROOT, ledger_ids, read_jsonl
from tests.scripted_model import ScriptedModel

STORED = ROOT / "tests" / "stored_runs" / "main-2026-12-01"


@pytest.fixture
def stored(tmp_path) -> Path:
    where = tmp_path / "stored"
    shutil.copytree(STORED, where, ignore=shutil.ignore_patterns("exports"))
    return where


def batch_runner(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def files_under(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", ["openai", "sharegpt", "atif", "sts"])
def test_a_run_of_the_earlier_version_exports_to_the_same_bytes(stored, fmt):
    output = "exported" if fmt in ("atif", "sts") else "exported.jsonl"
    res = batch_runner(stored, "export", "--run_name=old", "--output_dir=out", f"--format={fmt}", f"--output={output}")
    assert res.returncode == 0, res.stderr
    before = STORED / "exports" / (fmt if fmt in ("atif", "sts") else f"{fmt}.jsonl")
    now = files_under(stored / output)
    assert len(now) >= 1 and now == {(k if before.is_dir() else "exported.jsonl"): v
                                     for k, v in files_under(before).items()}


def test_a_run_of_the_earlier_version_resumes_where_it_stopped(stored):
    run = stored / "out" / "old"
    records_before = (run / "trajectories.jsonl").read_bytes()
    batches_before = {p.name: p.read_bytes() for p in run.glob("batch_*.jsonl")}
    done_before = ledger_ids(run)
    model = ScriptedModel(fail_marker="REFUSE-ME")
    model.start()
    flags = ["--resume", "--run_name=old", "--output_dir=out", "--dataset_file=dataset.jsonl",
             f"--base_url={model.base_url}", "--api_key=k", "--max_samples=8", "--sandbox_root=sandboxes"]
    try:  # the rows it left (six of eight were asked for), on another port than the one it was run on
        # its terminal has since gained background processes: a resume says so and writes nothing
        refused = batch_runner(stored, *flags)
        assert refused.returncode != 0 and "the tool definitions (hermes-batch was upgraded)" in refused.stderr
        assert (run / "trajectories.jsonl").read_bytes() == records_before
        res = batch_runner(stored, *flags, "--allow_config_change")
    finally:
        model.stop()
    assert "8 already done, 2 discarded earlier; 2 failed earlier and will be retried; 6 to run" in res.stderr, res.stderr
    assert res.returncode != 0 and "this invocation: 4 done, 0 discarded, 2 failed" in res.stderr  # the refused row again
    records = read_jsonl(run / "trajectories.jsonl")
    assert (run / "trajectories.jsonl").read_bytes().startswith(records_before)  # what it held, byte for byte
    assert len(records) == 12 and len({r["id"] for r in records}) == 12
    for name, content in batches_before.items():
        assert (run / name).read_bytes().startswith(content)
    assert ledger_ids(run)[:len(done_before)] == done_before
    assert sorted(ledger_ids(run)) == sorted(r["id"] for r in records)
    assert {r["prompt_index"] for r in records} == {0, 1, 2, 5, 6, 7}
    assert [r.get("format") for r in records] == [None] * 8 + [FORMAT] * 4  # the old as they were, the new named
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["trajectories"] == 12 and stats["verification"]["pass"] == 9


def test_a_run_holding_a_record_of_a_later_format_is_refused_by_name_not_misread(stored):
    path = stored / "out" / "old" / "trajectories.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    later = json.loads(lines[3])
    later["format"] = FORMAT + 1
    lines[3] = json.dumps(later) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    res = batch_runner(stored, "export", "--run_name=old", "--output_dir=out", "--output=x.jsonl")
    assert res.returncode != 0 and not (stored / "x.jsonl").exists()
    assert f"trajectories.jsonl: record {later['id']!r} is of format {FORMAT + 1}, written by a later hermes-batch" \
        in res.stderr and "Traceback" not in res.stderr
