"""Several samples per prompt (--samples): each its own unit of work, sandbox and seed; pass@k and
the other figures over them, against hand-computed values and a simulation."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from itertools import combinations

import pytest

from hermes_batch.record.samples import sample_id, sample_seed
from hermes_batch.stats.passk import PromptTally, histogram, interval, ks_up_to, pass_at_k, pass_hat_k, summary
from tests.conftest import CLI, ROOT, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_crash_safety import ids_in, kill_9_at

# --- the estimators -------------------------------------------------------------------------------


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of all k-subsets of the samples with at least one pass (the definition)."""
    subsets = list(combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def brute_pass_hat_k(outcomes: list[bool], k: int) -> float:
    subsets = list(combinations(outcomes, k))
    return sum(all(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (4, 1), (4, 3), (5, 2), (8, 0), (8, 8), (10, 3)])
def test_pass_at_k_and_pass_hat_k_are_the_share_of_k_subsets_that_pass(n, c):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k))
        assert pass_hat_k(n, c, k) == pytest.approx(brute_pass_hat_k(outcomes, k))
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5) and pass_hat_k(4, 3, 2) == pytest.approx(0.5)  # by hand


def test_the_estimates_find_known_success_probabilities():
    """Prompts with a known chance of success, sampled 8 times each: pass@k and pass^k come out near
    1-(1-p)^k and p^k averaged, and the 95 % interval holds the true pass@1."""
    rng = random.Random(1)
    probs = [rng.random() for _ in range(400)]
    tallies = {}
    for i, p in enumerate(probs):
        passed = sum(rng.random() < p for _ in range(8))
        tallies[f"p{i}"] = PromptTally(scored=8, passed=passed)
    s = summary(tallies)
    assert list(s["pass@k"]) == ["1", "2", "4", "8"]
    for k in (1, 2, 4, 8):
        truth_at = sum(1 - (1 - p) ** k for p in probs) / len(probs)
        truth_all = sum(p**k for p in probs) / len(probs)
        assert s["pass@k"][str(k)] == pytest.approx(truth_at, abs=0.03), k
        assert s["pass^k"][str(k)] == pytest.approx(truth_all, abs=0.03), k
    lo, hi = s["pass@1_ci95"]
    assert lo < sum(probs) / len(probs) < hi and hi - lo < 0.12 and s["ci95_method"] == "bootstrap"


def test_errors_are_left_out_and_a_prompt_counts_for_the_ks_it_has():
    tallies = {"a": PromptTally(scored=4, passed=1, errors=2), "b": PromptTally(scored=2, passed=2),
               "c": PromptTally(errors=3)}
    s = summary(tallies)
    assert s["samples_scored"] == 6 and s["samples_error"] == 5 and s["prompts_scored"] == 2 and s["prompts"] == 3
    assert s["pass@k"]["1"] == pytest.approx((0.25 + 1) / 2)
    assert s["pass@k"]["4"] == pytest.approx(1.0)  # only "a" has 4 scored samples: 1 - C(3,4)/C(4,4)
    assert s["pass^k"]["2"] == pytest.approx((0 + 1) / 2)
    assert s["pass_rate_histogram"] == {"0.2-0.3": 1, "1": 1} and s["mixed_prompts"] == 1
    # the other reading, beside it: errors as fails (a: 1 of 6, b: 2 of 2, c: 0 of 3)
    assert s["pass@k_errors_as_fail"]["1"] == pytest.approx((1 / 6 + 1 + 0) / 3, abs=1e-4)
    assert s["pass@k_errors_as_fail"]["4"] == pytest.approx(1 - 5 / 15, abs=1e-4)  # a alone has 4: 1 - C(5,4)/C(6,4)


def test_every_rate_is_given_both_ways_errors_left_out_and_errors_as_fails():
    from hermes_batch.stats.statistics import Statistics

    stats = Statistics()
    for i, status in enumerate(["pass", "pass", "fail", "error", "error"]):
        stats.add({"id": f"p{i}", "prompt_id": f"p{i}", "completed": True, "api_calls": 1, "tool_stats": {},
                   "conversations": [], "verification": {"status": status, "score": None, "checks": [], "seconds": 0}})
    v = stats.verification()
    assert (v["pass_rate"], v["pass_rate_errors_as_fail"]) == (round(2 / 3, 4), 0.4)
    assert any("pass rate 66.7% of 3 scored (40.0% of 5 counting those as fails)" in line for line in stats.summary_lines())


def test_small_helpers():
    assert ks_up_to(1) == [1] and ks_up_to(4) == [1, 2, 4] and ks_up_to(6) == [1, 2, 4, 6]
    assert histogram([0, 0, 1, 0.5, 0.05]) == {"0": 2, "0.0-0.1": 1, "0.5-0.6": 1, "1": 1}
    assert interval([0.5]) == (None, None)
    wide = [0.0, 1.0] * 1500  # many prompts: the normal interval
    (lo, hi), how = interval(wide)
    assert how == "normal" and lo == pytest.approx(0.5 - 1.96 * 0.5 / math.sqrt(3000), abs=1e-3) and hi > 0.5
    assert sample_id("abc-0", 0) == "abc-0" and sample_id("abc-0", 3) == "abc-0#3"
    assert sample_seed("abc-0", 1) == sample_seed("abc-0", 1) != sample_seed("abc-0", 2)


def test_majority_vote_takes_the_answer_most_samples_gave():
    right = PromptTally(scored=5, passed=2, answers={"42": [2, 1], "41": [1, 0], "40": [2, 0]})
    wrong = PromptTally(scored=3, passed=1, answers={"7": [1, 1], "8": [2, 0]})
    mostly = PromptTally(scored=3, passed=2, answers={"7": [2, 1], "8": [1, 0]})
    s = summary({"a": wrong, "b": mostly})
    assert s["majority_vote"] == {"prompts": 2, "accuracy": 0.5}
    assert summary({"a": right})["majority_vote"]["accuracy"] in (0.0, 1.0)  # a tie: one of them, always the same


# --- end to end -----------------------------------------------------------------------------------

ROWS = [
    {"prompt": script({"answer": ["the answer is 42", "the answer is 41"]}, text=f"sometimes right {i}"),
     "expected": 42, "match": "number"}
    for i in range(3)
] + [{"prompt": script({"answer": "the answer is 42"}, text="always right"), "expected": 42, "match": "number"},
      {"prompt": script({"answer": "the answer is 41"}, text="always wrong"), "expected": 42, "match": "number"}]


def outcome(prompt_id: str, sample: int, row: int) -> bool:
    """What the scripted model makes of a sample: rows 0-2 answer by their seed's parity."""
    return row == 3 or (row < 3 and sample_seed(prompt_id, sample) % 2 == 0)


def test_each_sample_is_its_own_run_seed_and_record_and_pass_at_k_is_what_they_say(cli, model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    res = cli.run("s", data, samples=4, temperature=0.7)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "5 prompts in" in res.stderr and "× 4 samples" in res.stderr and "20 to run" in res.stderr
    records = read_jsonl(cli.run_dir("s") / "trajectories.jsonl")
    assert len(records) == 20 and len({r["id"] for r in records}) == 20
    by_prompt: dict[str, list[dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
        assert r["samples"] == 4 and r["id"] == sample_id(r["prompt_id"], r["sample"])
    assert sorted(len(v) for v in by_prompt.values()) == [4] * 5
    outcomes = {}
    for pid, recs in by_prompt.items():
        assert sorted(r["sample"] for r in recs) == [0, 1, 2, 3]
        row = recs[0]["prompt_index"]
        assert all(r["prompt_index"] == row for r in recs)
        for r in recs:
            assert r["verification"]["status"] == ("pass" if outcome(pid, r["sample"], row) else "fail"), (pid, r["sample"])
        outcomes[pid] = [outcome(pid, s, row) for s in range(4)]
    # each sample asked with its own seed (the same on every turn of that sample)
    seeds = Counter(req.get("seed") for req in model.requests)
    assert len(seeds) == 20 and None not in seeds
    stats = json.loads((cli.run_dir("s") / "statistics.json").read_text())
    s = stats["samples"]
    assert stats["samples_per_prompt"] == 4 and s["prompts_scored"] == 5 and s["samples_scored"] == 20
    for k in (1, 2, 4):
        by_hand = sum(brute_pass_at_k(o, k) for o in outcomes.values()) / 5
        assert s["pass@k"][str(k)] == pytest.approx(by_hand, abs=1e-4), k
        assert s["pass^k"][str(k)] == pytest.approx(sum(brute_pass_hat_k(o, k) for o in outcomes.values()) / 5, abs=1e-4)
    # the answer most samples gave is right (a tie goes to the first sample's, merged first)
    majority = [sum(o) > len(o) / 2 or (sum(o) == len(o) / 2 and o[0]) for o in outcomes.values()]
    assert s["majority_vote"] == {"prompts": 5, "accuracy": round(sum(majority) / 5, 4)}
    assert s["mixed_prompts"] == sum(0 < sum(o) < 4 for o in outcomes.values())
    assert "pass@1" in res.stderr and "pass@4" in res.stderr and "pass^2" in res.stderr


def test_raising_samples_on_resume_runs_only_the_new_ones(cli, model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    first = cli.run("r", data, samples=2, temperature=0.7)
    assert first.returncode == 0, first.stderr[-3000:]
    asked = len(model.requests)
    assert asked == 10  # one request per sample (the scripted answer comes at once)
    again = cli.run("r", data, resume=True, samples=4)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "10 already done" in again.stderr and "10 to run" in again.stderr
    new_seeds = {req.get("seed") for req in model.requests[asked:]}
    records = read_jsonl(cli.run_dir("r") / "trajectories.jsonl")
    assert len(records) == 20 and len({r["id"] for r in records}) == 20
    assert {r["sample"] for r in records if r["samples"] == 2} == {0, 1}
    assert {sample_seed(r["prompt_id"], r["sample"]) for r in records if r["samples"] == 4} == new_seeds
    assert json.loads((cli.run_dir("r") / "statistics.json").read_text())["samples"]["samples_scored"] == 20
    once_more = cli.run("r", data, resume=True)  # the stored --samples=4: nothing owed
    assert once_more.returncode == 0 and "20 already done" in once_more.stderr and "0 to run" in once_more.stderr
    fewer = cli.run("r", data, resume=True, samples=1)  # lowering it runs nothing and drops nothing
    assert fewer.returncode == 0 and "5 already done" in fewer.stderr and "0 to run" in fewer.stderr, fewer.stderr
    kept = read_jsonl(cli.run_dir("r") / "trajectories.jsonl")
    assert len(kept) == 20 and all(r["prompt_index"] is not None for r in kept)


def test_kill_9_mid_run_then_resume_gives_every_sample_exactly_once(tmp_path):
    with ScriptedModel(latency=0.1, record_requests=False) as model:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"sampled prompt {i}"} for i in range(20)])
        kill_9_at(cli, "k", data, [0, 25, 50], samples=4, num_workers=2, concurrency=6, batch_size=7)
        res = cli.run("k", data, resume=True, num_workers=2, concurrency=8, batch_size=7)
        assert res.returncode == 0, res.stderr[-3000:]
    final = ids_in(cli.run_dir("k") / "trajectories.jsonl")
    assert len(final) == 80 and set(final.values()) == {1}
    records = read_jsonl(cli.run_dir("k") / "trajectories.jsonl")
    assert Counter(r["prompt_id"] for r in records) == Counter({pid: 4 for pid in {r["prompt_id"] for r in records}})
    assert len({r["prompt_id"] for r in records}) == 20


# --- curation in export ---------------------------------------------------------------------------


def sampled_run(cli, tmp_path, name: str = "c") -> dict[str, list[bool]]:
    """Run ROWS 4 times each; each prompt's outcomes by sample."""
    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    res = cli.run(name, data, samples=4, temperature=0.7)
    assert res.returncode == 0, res.stderr[-3000:]
    outcomes: dict[str, list[bool]] = {}
    for r in read_jsonl(cli.run_dir(name) / "trajectories.jsonl"):
        outcomes.setdefault(r["prompt_id"], [False] * 4)[r["sample"]] = outcome(r["prompt_id"], r["sample"], r["prompt_index"])
    return outcomes


def export_args(cli, name: str, output, **flags) -> list[str]:
    return [sys.executable, str(ROOT / "batch_runner.py"), "export", f"--run_name={name}", f"--output_dir={cli.out}",
            f"--output={output}", *(f"--{k}={v}" for k, v in flags.items())]


def exported(cli, tmp_path, name: str, output: str, **flags) -> tuple[list[dict], str]:
    res = subprocess.run(export_args(cli, name, tmp_path / output, **flags), cwd=cli.workdir, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return (read_jsonl(tmp_path / output) if output.endswith(".jsonl") else []), res.stderr


def metadata_of(row: dict) -> dict:
    return json.loads(row["metadata"])


def test_export_keeps_per_prompt_what_is_asked(cli, tmp_path):
    outcomes = sampled_run(cli, tmp_path)
    passing = {sample_id(pid, s) for pid, o in outcomes.items() for s, ok in enumerate(o) if ok}
    rows, _ = exported(cli, tmp_path, "c", "passed.jsonl", keep="passed")
    assert {r["id"] for r in rows} == passing
    best, _ = exported(cli, tmp_path, "c", "best.jsonl", keep="best")
    assert sorted(metadata_of(r)["prompt_id"] for r in best) == sorted(outcomes)  # one per prompt
    for r in best:
        assert (metadata_of(r)["verification"]["status"] == "pass") == any(outcomes[metadata_of(r)["prompt_id"]])
    shortest, err = exported(cli, tmp_path, "c", "shortest.jsonl", keep="shortest")
    assert sorted(metadata_of(r)["prompt_id"] for r in shortest) == sorted(p for p, o in outcomes.items() if any(o))
    assert all(r["id"] in passing for r in shortest) and "not the shortest of its prompt" in err
    mixed, err = exported(cli, tmp_path, "c", "mixed.jsonl", min_pass_rate=0.01, max_pass_rate=0.99)
    assert {metadata_of(r)["prompt_id"] for r in mixed} == {p for p, o in outcomes.items() if 0 < sum(o) < 4}
    assert len(mixed) == 4 * len({p for p, o in outcomes.items() if 0 < sum(o) < 4})
    assert "prompt pass rate above 0.99" in err and "prompt pass rate below 0.01" in err


def test_preference_pairs_a_passing_and_a_failing_sample_of_the_same_prompt(cli, tmp_path):
    outcomes = sampled_run(cli, tmp_path)
    rows, err = exported(cli, tmp_path, "c", "pairs.jsonl", format="preference")
    assert len(rows) == sum(min(sum(o), 4 - sum(o)) for o in outcomes.values()) > 0
    assert f"{len(rows)} pairs exported" in err
    used = Counter()
    for r in rows:
        meta = metadata_of(r)
        assert meta["chosen"]["verification"]["status"] == "pass" and meta["rejected"]["verification"]["status"] == "fail"
        assert meta["chosen"]["prompt_id"] == meta["rejected"]["prompt_id"] == meta["prompt_id"]
        assert [m["role"] for m in r["prompt"]] == ["system", "user"] and "SCRIPT" in r["prompt"][1]["content"]
        assert r["chosen"][-1]["role"] == "assistant" and "42" in r["chosen"][-1]["content"]
        assert r["rejected"][-1]["role"] == "assistant" and "41" in r["rejected"][-1]["content"]
        assert isinstance(json.loads(r["tools"]), list)
        used.update([meta["chosen"]["id"], meta["rejected"]["id"]])
    assert set(used.values()) == {1}  # each sample in one pair at most
    pytest.importorskip("datasets")
    import datasets

    exported(cli, tmp_path, "c", "pairs.parquet", format="preference")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "pairs.parquet"))["train"]
    assert ds.column_names == ["id", "prompt", "chosen", "rejected", "tools", "metadata"] and len(ds) == len(rows)
    refused = subprocess.run(export_args(cli, "c", tmp_path / "x.jsonl", format="preference", keep="best"),
                             cwd=cli.workdir, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "--format=preference writes pairs" in refused.stderr


def rendered(page, tmp_path) -> str:
    """The page as headless Chromium makes it (skipped without one, unless CI requires it)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if "chromium" in os.environ.get("HERMES_BATCH_REQUIRE_BACKENDS", ""):
            pytest.fail("chromium is required here (HERMES_BATCH_REQUIRE_BACKENDS) but not installed")
        pytest.skip("no chromium here (apt-get install chromium)")
    return subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120).stdout


def test_the_report_shows_pass_at_k_and_how_prompts_spread_over_pass_rates(cli, tmp_path):
    sampled_run(cli, tmp_path)
    stats = json.loads((cli.run_dir("c") / "statistics.json").read_text())["samples"]
    page = tmp_path / "report.html"
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "view", "--run_name=c", f"--output_dir={cli.out}",
                          f"--output={page}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    dom = rendered(page, tmp_path)
    shown = ", ".join(f"pass@{k} {100 * v:.1f}%" for k, v in stats["pass@k"].items())
    assert f"{shown} over 5 prompts" in dom, dom[-3000:]
    assert "prompts by pass rate" in dom and "pass@k (pass^k)" in dom


def test_two_runs_of_one_dataset_side_by_side(cli, tmp_path):
    """Model a always answers prompts 0-2 right and 3 wrong; model b gets 0 right, 1 by its seed, 2-3 wrong."""
    right, wrong = "the answer is 42", "the answer is 41"
    answers = [{"a": right, "b": right}, {"a": right, "b": [right, wrong]}, {"a": right, "b": wrong}, {"a": wrong, "b": wrong}]
    rows = [{"prompt": script({"answer": a}, text=f"compare {i}"), "expected": 42} for i, a in enumerate(answers)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    for model in ("a", "b"):
        res = cli.run(model, data, samples=2, model=model, temperature=0.7)
        assert res.returncode == 0, res.stderr[-3000:]
    page = tmp_path / "cmp.html"
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "view", "--run_name=a,b", f"--output_dir={cli.out}",
                          f"--output={page}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    b_recs = [r for r in read_jsonl(cli.run_dir("b") / "trajectories.jsonl") if r["prompt_index"] == 1]
    b_rate = sum(r["verification"]["status"] == "pass" for r in b_recs) / 2
    diffs = [0.0, 1 - b_rate, 1.0, 0.0]
    wins = sum(d > 0 for d in diffs)
    assert "a (a): pass rate 75.0% of 8 scored" in res.stderr
    assert (f"over the 4 prompts scored in both: a passes more often on {wins}, b on 0, as often on {4 - wins}; "
            f"mean difference a − b {sum(diffs) / 4:+.3f}") in res.stderr, res.stderr
    text = rendered(page, tmp_path)
    assert "<h1>a vs b</h1>" in text and text.count("<tr><td>") == 4 and "<td>2/2</td><td>0/2</td>" in text
    one = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "view", "--run_name=a,b,c",
                          f"--output_dir={cli.out}"], capture_output=True, text=True, timeout=120)
    assert one.returncode != 0 and "one run, or two to compare" in one.stderr


# --- found by a review ----------------------------------------------------------------------------


def test_raising_samples_from_one_counts_the_first_samples_too(cli, model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert cli.run("one", data, temperature=0.7).returncode == 0
    res = cli.run("one", data, resume=True, samples=3)
    assert res.returncode == 0, res.stderr[-3000:]
    stats = json.loads((cli.run_dir("one") / "statistics.json").read_text())
    assert stats["samples"]["samples_scored"] == 15 and list(stats["samples"]["pass@k"]) == ["1", "2", "3"]
    assert stats["samples"]["pass@k"]["1"] == pytest.approx(stats["verification"]["pass_rate"], abs=1e-4)


def test_pass_at_k_says_over_how_many_prompts_each_k_is_and_a_tie_goes_to_the_earliest_sample():
    from hermes_batch.stats.passk import tally

    def rec(pid, sample, status, answer):
        check = {"kind": "answer", "status": status, "answer": answer}
        return {"id": sample_id(pid, sample), "prompt_id": pid, "sample": sample, "samples": 12,
                "verification": {"status": status, "checks": [check]}}

    tallies: dict = {}
    for s in range(12):  # samples 2 and 3 answer right, 10 and 11 wrong, the rest err
        if s in (10, 11):  # merged first: ids sort as text
            tally(tallies, rec("p", s, "fail", "B"))
    for s in range(12):
        if s in (2, 3):
            tally(tallies, rec("p", s, "pass", "A"))
        elif s not in (10, 11):
            tally(tallies, {**rec("p", s, "error", ""), "verification": {"status": "error", "checks": []}})
    tally(tallies, rec("q", 0, "fail", "B"))
    s = summary(tallies)
    assert s["majority_vote"] == {"prompts": 2, "accuracy": 0.5}  # p: A (sample 2) beats B (sample 10)
    assert s["pass@k_prompts"] == {"1": 2, "2": 1, "4": 1} and s["samples_error"] == 8


def test_a_check_edited_between_resumes_is_named_and_never_paired_across(cli, model, tmp_path):
    wrong = [{**r, "expected": 41} for r in ROWS]
    assert cli.run("e", write_jsonl(tmp_path / "f.jsonl", wrong), samples=2, temperature=0.7).returncode == 0
    res = cli.run("e", write_jsonl(tmp_path / "f.jsonl", ROWS), resume=True, samples=4)  # the file, its checks fixed
    assert res.returncode == 0, res.stderr[-3000:]
    assert "warning: 10 trajectories were scored by checks their rows no longer have" in res.stderr, res.stderr
    rows, _ = exported(cli, tmp_path, "e", "pairs.jsonl", format="preference")
    assert rows
    for r in rows:  # both halves scored by the same checks (the old ones, or the new)
        meta = metadata_of(r)
        assert meta["chosen"]["verification"]["check_version"] == meta["rejected"]["verification"]["check_version"]
    fixed = recheck_all(cli, tmp_path, "e", tmp_path / "f.jsonl")
    assert "10 verdict(s) changed" in fixed.stderr or "verdict(s) changed" in fixed.stderr
    again = cli.run("e", tmp_path / "f.jsonl", resume=True)
    assert "scored by checks their rows no longer have" not in again.stderr


def recheck_all(cli, tmp_path, name, data) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "recheck", f"--run_name={name}",
                          f"--output_dir={cli.out}", f"--dataset_file={data}"], cwd=cli.workdir, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_rows_that_ask_the_same_but_check_differently_are_refused(cli, tmp_path):
    p = script({"answer": "Paris"}, text="Name a capital city of a European country.")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": p, "expected": "Paris"}, {"prompt": "other"},
                                              {"prompt": p, "expected": "Berlin"}, {"prompt": p, "expected": "Paris"}])
    from hermes_batch.dataset.rows import load_dataset

    ds = load_dataset(data)
    assert [x.line for x in ds.problems] == [3] and "asks the agent exactly what line 1 asks" in ds.problems[0].message
    assert len(ds.ids) == 3  # the same row twice is two prompts, as ever
    # appended before a --resume, which reads the run's index and then only what was appended (a review)
    index = tmp_path / "index"
    ds.write_index(index)
    with open(data, "a") as f:
        f.write(json.dumps({"prompt": p, "expected": "Madrid"}) + "\n")
    grown = load_dataset(data, index=index)
    assert grown.from_index is False and [x.line for x in grown.problems] == [3, 5], grown.problems
    assert "asks the agent exactly what line 1 asks" in grown.problems[1].message and len(grown.ids) == 3


def test_sharegpt_parquet_keeps_which_prompt_and_sample_a_row_is(cli, tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    sampled_run(cli, tmp_path)
    exported(cli, tmp_path, "c", "s.parquet", format="sharegpt")
    table = pq.read_table(tmp_path / "s.parquet").to_pylist()
    assert {(r["prompt_id"], r["sample"], r["samples"]) for r in table} == \
        {(r["prompt_id"], r["sample"], 4) for r in read_jsonl(cli.run_dir("c") / "trajectories.jsonl")}
