"""End-to-end runs of the CLI: output files and schema, filters, and every resume rule."""

from __future__ import annotations

import json
from collections import Counter

from hermes_batch.record.reference import REFERENCE_TOOL_NAMES
from hermes_batch.tools import ALL_TOOL_NAMES
from tests.conftest import CLI, ledger_ids, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script

RECORD_KEYS = {"id", "prompt_index", "prompt_id", "sample", "samples", "conversations", "metadata", "completed", "partial", "verification", "api_calls",
               "toolsets_used", "tool_stats", "tool_error_counts", "format"}


def prompts(n: int, tag: str = "task") -> list[dict]:
    return [{"prompt": f"{tag} number {i}", "n": i} for i in range(n)]


def test_a_run_writes_every_output_file_in_the_contract(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", prompts(25))
    res = cli.run("full", data, batch_size=10, num_workers=3, concurrency=6)
    assert res.returncode == 0, res.stderr
    run = cli.run_dir("full")
    assert sorted(p.name for p in run.glob("batch_*.jsonl")) == ["batch_0.jsonl", "batch_1.jsonl", "batch_2.jsonl"]
    assert [len(read_jsonl(run / f"batch_{k}.jsonl")) for k in range(3)] == [10, 10, 5]
    for k in range(3):
        assert {r["prompt_index"] // 10 for r in read_jsonl(run / f"batch_{k}.jsonl")} == {k}
    records = read_jsonl(run / "trajectories.jsonl")
    assert [r["prompt_index"] for r in records] == list(range(25))
    for r in records:
        assert set(r) == RECORD_KEYS
        # this product's tools, then the Hermes Agent's others (a file of each loads with the other)
        padded = list(dict.fromkeys([*ALL_TOOL_NAMES, *REFERENCE_TOOL_NAMES]))
        assert list(r["tool_stats"]) == padded and list(r["tool_error_counts"]) == padded
        assert (r["prompt_id"], r["sample"], r["samples"]) == (r["id"], 0, 1)  # one sample per prompt: its own id
        assert r["metadata"]["batch_num"] == r["prompt_index"] // 10
        assert r["metadata"]["model"] == "scripted" and r["completed"] and not r["partial"]
        assert r["metadata"]["dataset"] == {"n": r["prompt_index"]}
        assert [t["from"] for t in r["conversations"]] == ["system", "human", "gpt", "tool", "gpt"]
    checkpoint = json.loads((run / "checkpoint.json").read_text())
    assert checkpoint["completed"] == 25 and checkpoint["discarded"] == checkpoint["failed"] == 0
    assert sorted(ledger_ids(run)) == sorted(r["id"] for r in records)  # each settled prompt once
    assert "api_key" not in checkpoint["config"] and "test-key" not in (run / "checkpoint.json").read_text()
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["total_prompts"] == 25 and stats["trajectories"] == 25 and stats["total_batches"] == 3
    assert stats["tool_statistics"]["terminal"] == {"count": 25, "success": 25, "failure": 0,
                                                    "success_rate": 100.0, "failure_rate": 0.0}
    assert stats["reasoning_statistics"]["turns_with_reasoning"] == 50
    assert stats["tokens"]["total"] == sum(r["metadata"]["usage"]["total_tokens"] for r in records)


def test_trajectories_load_in_hugging_face_datasets(cli, tmp_path, monkeypatch):
    rows = prompts(6)
    rows[2]["prompt"] = script({"calls": [["read_file", {"path": "x"}], ["nope", {}]]}, {"answer": "k"})
    rows[3]["prompt"] = script({"answer": "no tools at all"})
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    assert cli.run("hf", data).returncode == 0
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    ds = datasets.load_dataset("json", data_files=str(cli.run_dir("hf") / "trajectories.jsonl"), split="train")
    assert ds.num_rows == 6
    assert set(ds.column_names) == RECORD_KEYS
    assert ds[2]["tool_stats"]["read_file"]["failure"] == 1
    # a string, as in the Hermes Agent's records (an ISO time without its fraction would load as a timestamp)
    assert ds.features["metadata"]["timestamp"].dtype == "string"


def test_duplicate_prompts_are_all_kept(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "same"}, {"prompt": "other"}, {"prompt": "same"}])
    assert cli.run("dups", data).returncode == 0
    records = read_jsonl(cli.run_dir("dups") / "trajectories.jsonl")
    assert len(records) == 3
    ids = [r["id"] for r in records]
    assert ids[0].endswith("-0") and ids[2].endswith("-1") and ids[0][:-2] == ids[2][:-2]


def test_no_reasoning_samples_are_discarded_recorded_and_never_rerun(tmp_path):
    model = ScriptedModel(reasoning=None)
    model.start()
    try:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", prompts(4))
        res = cli.run("noreason", data)
        assert res.returncode == 0, res.stderr
        assert "discarded for lacking reasoning" in res.stderr
        run = cli.run_dir("noreason")
        discarded = read_jsonl(run / "discarded.jsonl")
        assert len(discarded) == 4 and {d["discarded"] for d in discarded} == {"no_reasoning"}
        assert read_jsonl(run / "trajectories.jsonl") == []
        served = model.served
        res = cli.run("noreason", data, resume=True)
        assert res.returncode == 0 and model.served == served  # a resume does not re-run discards
        assert "4 discarded earlier" in res.stderr
        stats = json.loads((run / "statistics.json").read_text())
        assert stats["discarded_no_reasoning"] == 4
        assert cli.run("keep", data, require_reasoning=False).returncode == 0
        assert len(read_jsonl(cli.run_dir("keep") / "trajectories.jsonl")) == 4
    finally:
        model.stop()


def test_failed_prompts_are_recorded_and_retried_by_resume(tmp_path):
    model = ScriptedModel(fail_marker="FLAKY")
    model.start()
    try:
        cli = CLI(tmp_path, model)
        rows = prompts(6)
        rows[1]["prompt"] += " FLAKY"
        rows[4]["prompt"] += " FLAKY"
        data = write_jsonl(tmp_path / "d.jsonl", rows)
        res = cli.run("flaky", data)
        assert res.returncode == 3, res.stderr
        assert "2 prompt(s) not finished (2 failed): rerun with --resume" in res.stderr
        run = cli.run_dir("flaky")
        failed = read_jsonl(run / "failed.jsonl")
        assert sorted(f["prompt_index"] for f in failed) == [1, 4]
        assert all(f["error_kind"] == "bad_request" and "FLAKY" in f["error"] for f in failed)
        assert len(read_jsonl(run / "trajectories.jsonl")) == 4
        model.fail_marker = None
        res = cli.run("flaky", data, resume=True)
        assert res.returncode == 0, res.stderr
        assert "2 failed earlier and will be retried; 2 to run" in res.stderr
        records = read_jsonl(run / "trajectories.jsonl")
        # the resume appends what it added, in prompt order, and leaves the lines already merged as they were
        assert [r["prompt_index"] for r in records] == [0, 2, 3, 5, 1, 4]
        assert {r["prompt_index"]: r["metadata"]["attempt"] for r in records} == {0: 1, 1: 2, 2: 1, 3: 1, 4: 2, 5: 1}
        stats = json.loads((run / "statistics.json").read_text())
        assert stats["failed_outstanding"] == 0 and stats["trajectories"] == 6
    finally:
        model.stop()


def test_resume_matches_by_content_across_reordered_and_edited_datasets(cli, tmp_path):
    first = prompts(6)
    data = write_jsonl(tmp_path / "d.jsonl", first)
    assert cli.run("reorder", data).returncode == 0
    served = cli.model.served
    second = list(reversed(first))
    second[0] = {"prompt": "task number 5, edited", "n": 5}
    second.append({"prompt": "a brand new task"})
    write_jsonl(data, second)
    res = cli.run("reorder", data, resume=True)
    assert res.returncode == 0, res.stderr
    assert "5 already done" in res.stderr and "2 to run" in res.stderr
    assert cli.model.served - served == 4  # two prompts × two model calls
    records = read_jsonl(cli.run_dir("reorder") / "trajectories.jsonl")
    prompts_seen = Counter(r["conversations"][1]["value"] for r in records)
    assert len(records) == 8 and set(prompts_seen.values()) == {1}
    assert "task number 5, edited" in prompts_seen and "a brand new task" in prompts_seen
    stats = json.loads((cli.run_dir("reorder") / "statistics.json").read_text())
    assert stats["trajectories"] == 8  # statistics describe the merged file, not this invocation


def test_resume_reuses_stored_settings_and_refuses_a_changed_configuration(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", prompts(3))
    assert cli.run("fp", data, max_turns=4, distribution="development").returncode == 0
    write_jsonl(data, prompts(4))
    # only what a resume needs: stored settings (model, max_turns, distribution...) come back
    res = cli.run("fp", data, resume=True)
    assert res.returncode == 0, res.stderr
    records = read_jsonl(cli.run_dir("fp") / "trajectories.jsonl")
    assert len(records) == 4 and len({r["metadata"]["config_fingerprint"] for r in records}) == 1
    write_jsonl(data, prompts(5))
    res = cli.run("fp", data, resume=True, max_turns=9, model="another-model")
    assert res.returncode == 1
    assert "max_turns: 4 → 9" in res.stderr and "model: 'scripted' → 'another-model'" in res.stderr
    assert "--allow_config_change" in res.stderr
    res = cli.run("fp", data, resume=True, max_turns=9, allow_config_change=True)
    assert res.returncode == 0, res.stderr
    assert len(read_jsonl(cli.run_dir("fp") / "trajectories.jsonl")) == 5


def test_toolsets_are_sampled_per_prompt_reproducibly(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", prompts(30))
    assert cli.run("s1", data, distribution="balanced").returncode == 0
    assert cli.run("s2", data, distribution="balanced").returncode == 0
    a = {r["id"]: r["toolsets_used"] for r in read_jsonl(cli.run_dir("s1") / "trajectories.jsonl")}
    b = {r["id"]: r["toolsets_used"] for r in read_jsonl(cli.run_dir("s2") / "trajectories.jsonl")}
    assert a == b
    assert all(a.values())  # at least one toolset each
    assert len({tuple(v) for v in a.values()}) > 5  # and they vary
    offered = [set(r["metadata"]["tools_offered"]) for r in read_jsonl(cli.run_dir("s1") / "trajectories.jsonl")]
    assert any("terminal" not in o for o in offered)
    assert cli.run("fixed", data, toolsets="code").returncode == 0
    fixed = read_jsonl(cli.run_dir("fixed") / "trajectories.jsonl")
    assert all(r["toolsets_used"] == ["code"] and r["metadata"]["distribution"] is None for r in fixed)


def test_the_merge_holds_few_files_open_however_many_batch_files_the_run_has(tmp_path):
    """A run of 1,000,000 prompts in batches of 10 has 100,000 batch files; the merge must not
    keep each one open (it did, and a run past the descriptor limit could never finish)."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    run = tmp_path / "run"
    run.mkdir()
    for k in range(300):  # more files than the limit the merge gets below
        with open(run / f"batch_{k}.jsonl", "w") as f:
            for j in range(2):
                f.write(json.dumps({"id": f"p{k}-{j}", "prompt_index": 2 * k + j, "metadata": {}}) + "\n")
    index_of = {f"p{k}-{j}": 2 * k + j for k in range(300) for j in range(2)}
    code = ("import resource, sys; from pathlib import Path; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128)); "
            "from hermes_batch.store import RunStore; "
            f"store = RunStore(Path({str(run)!r})); print(store.merge(store.scan(), {index_of!r})[0])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "600"
    ids = [json.loads(line)["prompt_index"] for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert ids == list(range(600))


def test_a_local_sandbox_is_made_only_when_a_tool_needs_it(cli, tmp_path):
    """A local sandbox costs two directories: it is made when a tool first asks, not for every
    prompt alongside its first model call (containers still start early: their start is slow)."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": script({"answer": "no tool needed"}, text="plain")},
                                              {"prompt": "uses the terminal"}])
    res = cli.run("lazy", data, toolsets="terminal")
    assert res.returncode == 0, res.stderr[-2000:]
    timings = {r["prompt_index"]: r["metadata"]["timings"] for r in read_jsonl(cli.run_dir("lazy") / "trajectories.jsonl")}
    assert timings[0]["sandbox_start_seconds"] is None  # never made
    assert timings[1]["sandbox_start_seconds"] is not None
