"""Load: a run that meets a misbehaving endpoint and is killed again and again still ends with
every prompt exactly once. The full-size figures in docs/benchmarks.md come from benchmarks/soak.py."""

from __future__ import annotations

from benchmarks.soak import soak


def test_faults_and_repeated_kill_9_lose_and_duplicate_nothing(tmp_path):
    figures = soak(tmp_path, prompts=1500, kills=3, chaos=0.05, concurrency=48, workers=2, seed=7)
    assert figures["faults_injected"] > 50 and len(figures["faults_by_kind"]) == 7, figures
    assert figures["exit_codes"][:3] == ["killed"] * 3 and figures["exit_codes"][-1] == 0, figures
    assert figures["lost"] == 0 and figures["trajectories"] == 1500, figures
    assert figures["duplicated_in_trajectories"] == 0 and figures["duplicated_in_batch_files"] == 0, figures
    assert figures["ledger_completed"] == 1500 and figures["statistics_trajectories"] == 1500, figures
    assert figures["statistics_api_calls"] == figures["expected_api_calls"], figures
