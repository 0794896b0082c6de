"""Faults end as recorded outcomes: no hang, no dead run, no reply mistaken for an answer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import httpx
import openai
import pytest

from hermes_batch.llm.chat_completions import MAX_RETRY_WAIT, _retry_after
from tests.conftest import CLI, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script
from tests.test_crash_safety import worker_pids

MODERATION_403 = {"status": 403, "error": {
    "code": 403, "message": "Input was flagged by moderation",
    "metadata": {"reasons": ["harassment"], "flagged_input": "...", "provider_name": "X", "model_slug": "m"}}}


def test_a_reply_with_a_lone_surrogate_is_written_safely_instead_of_hanging_the_run(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"answer": "broken \ud800 text"})},
        {"prompt": "an ordinary prompt"},
    ])
    res = cli.run("surrogate", data, timeout=90)  # before the fix: nothing reached the parent, it waited forever
    assert res.returncode == 0, res.stderr[-2000:]
    records = read_jsonl(cli.run_dir("surrogate") / "trajectories.jsonl")
    assert len(records) == 2
    answer = next(r for r in records if "broken" in r["conversations"][-1]["value"])
    assert "broken \ufffd text" in answer["conversations"][-1]["value"]
    (cli.run_dir("surrogate") / "trajectories.jsonl").read_bytes().decode("utf-8")  # valid UTF-8 throughout


def test_a_reply_that_ended_in_an_error_is_retried_not_saved_as_an_answer(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"answer": "the real answer", "fault": {"finish_reason": "error", "times": 1}})},
        {"prompt": script({"answer": "never right", "fault": {"finish_reason": "error"}})},
        {"prompt": script({"answer": "after a gap", "fault": {"no_message": True, "times": 2}})},
    ])
    res = cli.run("errfinish", data, max_retries=2)
    assert res.returncode == 3, res.stderr[-2000:]
    done = read_jsonl(cli.run_dir("errfinish") / "trajectories.jsonl")
    answers = sorted(r["conversations"][-1]["value"].split("</think>\n")[-1] for r in done)
    assert answers == ["after a gap", "the real answer"]
    assert all(r["completed"] and r["metadata"]["llm_calls"][-1]["finish_reason"] == "stop" for r in done)
    failed = read_jsonl(cli.run_dir("errfinish") / "failed.jsonl")
    assert [f["error_kind"] for f in failed] == ["model_error"]
    assert "ended with an error" in failed[0]["error"]


def test_a_moderation_refusal_fails_that_prompt_and_the_run_goes_on(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"answer": "x", "fault": MODERATION_403})},
        {"prompt": "fine 1"}, {"prompt": "fine 2"},
    ])
    res = cli.run("moderated", data)
    assert res.returncode == 3, res.stderr[-2000:]  # some failed: not a fatal stop
    assert len(read_jsonl(cli.run_dir("moderated") / "trajectories.jsonl")) == 2
    failed = read_jsonl(cli.run_dir("moderated") / "failed.jsonl")
    assert [f["error_kind"] for f in failed] == ["moderation"] and "flagged" in failed[0]["error"]
    again = cli.run("moderated", data, resume=True)  # before the fix: every resume aborted on it again
    assert again.returncode == 3 and "refused access" not in again.stderr


def test_a_403_that_is_not_moderation_still_stops_the_run(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"answer": "x", "fault": {"status": 403, "error": {"message": "Key disabled"}}})},
    ])
    res = cli.run("forbidden", data)
    assert res.returncode == 1 and "refused access" in res.stderr


def _rate_limited(headers: dict) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(429, headers=headers, request=request, json={"error": {"message": "slow down"}})
    return openai.RateLimitError("slow down", response=response, body=None)


@pytest.mark.parametrize("headers, low, high", [
    ({"retry-after": "86400"}, MAX_RETRY_WAIT, MAX_RETRY_WAIT * 1.2),  # a day: capped
    ({"retry-after": "2"}, 2.0, 2.4),
    ({"retry-after-ms": "1500"}, 1.5, 1.8),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0, 0.0),  # a date in the past: now
])
def test_retry_after_is_capped_and_jittered(headers, low, high):
    waits = {_retry_after(_rate_limited(headers)) for _ in range(20)}
    assert all(low <= w <= high for w in waits), waits
    if high > low:
        assert len(waits) > 1  # jittered: waiting prompts do not all come back at once


@pytest.mark.parametrize("value", ["soon", "", "Someday, 99 Foo 20xx", "nan"])
def test_an_unparsable_retry_after_is_ignored_not_an_internal_error(value):
    assert _retry_after(_rate_limited({"retry-after": value})) is None


def test_a_garbage_retry_after_header_does_not_fail_the_prompt(cli, tmp_path):
    fault = {"status": 429, "error": {"message": "slow"}, "headers": {"Retry-After": "soon"}, "times": 1}
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": script({"answer": "ok", "fault": fault})}])
    res = cli.run("garbage-ra", data)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((cli.run_dir("garbage-ra") / "statistics.json").read_text())["merged_trajectories"] == 1


def test_a_request_refused_mid_trajectory_keeps_the_paid_turns_as_a_partial_record(cli, tmp_path):
    too_long = {"status": 400, "error": {"message": "This endpoint's maximum context length is 8192 tokens"}}
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"calls": [["terminal", {"command": "seq 1 5"}]]}, {"answer": "x", "fault": too_long})},
        {"prompt": script({"answer": "x", "fault": {"status": 413, "error": {"message": "too large"}}})},
    ])
    res = cli.run("rejected", data)
    assert res.returncode == 3, res.stderr[-2000:]
    kept = read_jsonl(cli.run_dir("rejected") / "trajectories.jsonl")
    assert len(kept) == 1  # before the fix: both failed and the paid turn was lost
    rec = kept[0]
    assert rec["metadata"]["stop_reason"] == "request_rejected" and rec["partial"] and not rec["completed"]
    assert rec["api_calls"] == 1 and rec["metadata"]["usage"]["total_tokens"] > 0
    assert [t["from"] for t in rec["conversations"]] == ["system", "human", "gpt", "tool"]
    failed = read_jsonl(cli.run_dir("rejected") / "failed.jsonl")
    assert [f["error_kind"] for f in failed] == ["bad_request"] and "usage" in failed[0]


def test_a_failure_record_keeps_what_the_prompt_spent(cli, tmp_path):
    dead_later = {"status": 500, "error": {"message": "upstream died"}}
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"calls": [["terminal", {"command": "true"}]]}, {"answer": "x", "fault": dead_later})},
    ])
    res = cli.run("spent", data, max_retries=1)
    assert res.returncode == 3
    failure = read_jsonl(cli.run_dir("spent") / "failed.jsonl")[0]
    assert failure["error_kind"] == "server_error" and failure["usage"]["total_tokens"] > 0


def test_a_prompt_that_keeps_failing_is_given_up_after_max_attempts(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"answer": "x", "fault": {"status": 400, "error": {"message": "never valid"}}})},
        {"prompt": "fine"},
    ])
    for attempt in range(1, 4):
        res = cli.run("attempts", data, resume=attempt > 1, max_attempts=2)
        assert res.returncode == 3, res.stderr[-2000:]
    failed = read_jsonl(cli.run_dir("attempts") / "failed.jsonl")
    assert [f["attempt"] for f in failed] == [1, 2]  # the third invocation did not send it again
    assert "1 failed 2 times and will not be retried (raise --max_attempts" in res.stderr
    again = cli.run("attempts", data, resume=True, max_attempts=3)
    assert [f["attempt"] for f in read_jsonl(cli.run_dir("attempts") / "failed.jsonl")] == [1, 2, 3]
    assert again.returncode == 3


def test_a_prompt_past_its_time_limit_keeps_its_finished_turns_and_the_run_goes_on(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"calls": [["terminal", {"command": "echo first-step"}]]},
                          {"calls": [["terminal", {"command": "sleep 60"}]]}, {"answer": "never"})},
        {"prompt": script({"calls": [["terminal", {"command": "sleep 60"}]]}, {"answer": "never"})},
        {"prompt": "quick"},
    ])
    started = time.monotonic()
    res = cli.run("deadline", data, prompt_timeout=10, command_timeout=120)  # the first step fits on a busy machine
    assert time.monotonic() - started < 50  # not the 60 s the commands wanted
    assert res.returncode == 3, res.stderr[-2000:]
    kept = read_jsonl(cli.run_dir("deadline") / "trajectories.jsonl")
    timed = next(r for r in kept if r["metadata"]["stop_reason"] == "prompt_timeout")
    assert timed["partial"] and [t["from"] for t in timed["conversations"]] == ["system", "human", "gpt", "tool"]
    assert "first-step" in timed["conversations"][-1]["value"]  # the unanswered second call was dropped
    assert timed["api_calls"] == 2  # but its spend is counted
    failed = read_jsonl(cli.run_dir("deadline") / "failed.jsonl")
    assert [f["error_kind"] for f in failed] == ["prompt_timeout"]


def test_the_watchdog_settles_prompts_of_a_stuck_worker(tmp_path):
    with ScriptedModel(latency=0.5) as model:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"stuck {i}"} for i in range(4)])
        proc = cli.popen("watchdog", data, num_workers=1, concurrency=4, prompt_timeout=2)
        deadline = time.monotonic() + 60
        workers = []
        while not workers and time.monotonic() < deadline:
            workers = worker_pids(proc.pid)
            time.sleep(0.05)
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # a worker that no longer answers, but is not dead
        try:
            _, err = proc.communicate(timeout=120)
        finally:
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        assert proc.returncode == 3, err
        failed = read_jsonl(cli.run_dir("watchdog") / "failed.jsonl")
        done = read_jsonl(cli.run_dir("watchdog") / "trajectories.jsonl")
        assert len(done) + len({f["id"] for f in failed}) == 4
        assert failed and all(f["error_kind"] == "watchdog" for f in failed)


@pytest.mark.parametrize("budget", ["max_total_tokens", "max_cost"])
def test_a_budget_stops_the_run_gracefully_and_resume_with_more_goes_on(tmp_path, budget):
    with ScriptedModel(latency=0.2, cost_per_token=1e-5) as model:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"budget {i}"} for i in range(16)])
        one = 540  # tokens of one two-call prompt here, roughly (the tool schemas counted: 532 since records follow the reference)
        small = {"max_total_tokens": 3 * one} if budget == "max_total_tokens" else {"max_cost": 3 * one * 1e-5}
        res = cli.run("budget", data, concurrency=2, num_workers=1, **small)
        assert res.returncode == 3, res.stderr[-2000:]
        assert "budget reached" in res.stderr and "raise it to go on" in res.stderr
        first = read_jsonl(cli.run_dir("budget") / "trajectories.jsonl")
        assert 1 <= len(first) < 16
        spent = sum(r["metadata"]["usage"]["total_tokens"] for r in first)
        assert spent < 3 * one + 3 * 2 * one  # stopped near the budget: only what was in flight went over
        # the same budget again: already spent, nothing starts
        again = cli.run("budget", data, resume=True, concurrency=2, num_workers=1, **small)
        assert again.returncode == 3 and len(read_jsonl(cli.run_dir("budget") / "trajectories.jsonl")) == len(first)
        more = {k: v * 100 for k, v in small.items()}
        done = cli.run("budget", data, resume=True, concurrency=2, num_workers=1, **more)
        assert done.returncode == 0, done.stderr[-2000:]
        ids = [r["id"] for r in read_jsonl(cli.run_dir("budget") / "trajectories.jsonl")]
        assert len(ids) == len(set(ids)) == 16


def test_indices_are_true_for_the_dataset_as_it_is_after_rows_are_removed(cli, tmp_path):
    rows = [{"prompt": f"row {i}"} for i in range(6)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    assert cli.run("edited", data, batch_size=2).returncode == 0
    edited = [rows[0], rows[3], rows[4], rows[5], {"prompt": "row new"}]  # rows 1 and 2 removed, one added
    write_jsonl(data, edited)
    res = cli.run("edited", data, resume=True, batch_size=2)
    assert res.returncode == 0, res.stderr[-2000:]
    merged = read_jsonl(cli.run_dir("edited") / "trajectories.jsonl")
    by_prompt = {r["conversations"][1]["value"]: r["prompt_index"] for r in merged}
    assert by_prompt == {"row 0": 0, "row 3": 1, "row 4": 2, "row 5": 3, "row new": 4, "row 1": None, "row 2": None}
    indices = [r["prompt_index"] for r in merged]
    assert indices == [0, 1, 2, 3, 4, None, None]  # unique, in order, the removed rows last
    checkpoint = json.loads((cli.run_dir("edited") / "checkpoint.json").read_text())
    assert checkpoint["completed"] == 7


def test_signed_reasoning_details_go_back_to_the_model_and_into_the_record(model, cli, tmp_path):
    details = [{"type": "reasoning.text", "text": "I should list the files.", "signature": "sig-abc123", "format": "anthropic-claude-v1", "index": 0}]
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": script(
        {"calls": [["terminal", {"command": "ls"}]], "reasoning": "", "reasoning_details": details},
        {"answer": "done"})}])
    res = cli.run("details", data)
    assert res.returncode == 0, res.stderr[-2000:]
    second = [r for r in model.requests if any(m.get("role") == "assistant" for m in r["messages"])][0]
    sent_back = next(m for m in second["messages"] if m.get("role") == "assistant")
    assert sent_back["reasoning_details"] == details  # before the fix: dropped, and the provider loses its thoughts
    rec = read_jsonl(cli.run_dir("details") / "trajectories.jsonl")[0]
    gpt = [t for t in rec["conversations"] if t["from"] == "gpt"]
    assert json.loads(gpt[0]["reasoning_details"]) == details and gpt[1]["reasoning_details"] is None
    assert "I should list the files." in gpt[0]["value"]  # the thoughts count as reasoning too
    assert all(set(t) == set(rec["conversations"][0]) for t in rec["conversations"])  # one schema for every turn


def test_an_outage_pauses_the_run_instead_of_failing_the_dataset(tmp_path):
    import threading

    with ScriptedModel(latency=0.1) as model:
        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"outage {i}"} for i in range(40)])
        proc = cli.popen("outage", data, num_workers=1, concurrency=4, max_retries=1)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while len(read_jsonl(cli.run_dir("outage") / "batch_0.jsonl")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        model.outage = True
        while not any("looks down" in ln for ln in lines) and time.monotonic() < deadline + 60:
            time.sleep(0.1)
        assert any("looks down" in ln for ln in lines), "".join(lines)
        time.sleep(2)
        model.outage = False
        assert proc.wait(timeout=180) == 0, "".join(lines)  # before: the outage's failures made it exit 3
        reader.join(5)
        assert any("answers again" in ln for ln in lines)
        ids = [r["id"] for r in read_jsonl(cli.run_dir("outage") / "trajectories.jsonl")]
        assert len(ids) == len(set(ids)) == 40
        stats = json.loads((cli.run_dir("outage") / "statistics.json").read_text())
        assert stats["failed_outstanding"] == 0 and stats["merged_trajectories"] == 40


def test_a_rate_limit_one_worker_meets_cuts_every_workers_request_limit(tmp_path):
    """The provider's limit is the run's: a 429 seen in one worker process is passed on (RateLimited
    to the run, Throttle from it to each other worker), so N workers do not each hit it in turn."""
    import asyncio
    import multiprocessing as mp
    import queue

    from hermes_batch.config import RunConfig
    from hermes_batch.episode.wire import Finished, RateLimited, Run, Stop, Throttle, WorkItem
    from hermes_batch.runner.executor import ProcessPool, _Process
    from hermes_batch.runner.worker import RunnerWatch, Worker, serve

    with ScriptedModel(rate_limit_first=1, retry_after=0.05) as model:
        config = RunConfig(run_name="rl", dataset_file="unused.jsonl", base_url=model.base_url, model="m",
                           sandbox_root=str(tmp_path), require_reasoning=False, toolsets=["terminal"])
        item = WorkItem(id="p0", index=0, prompt=script({"answer": "ok"}), toolsets=["terminal"], batch_num=0)

        def run_worker(number: int, *messages) -> tuple[Worker, list]:
            tasks: queue.Queue = queue.Queue()
            heard: list = []

            def emit(msg) -> None:
                heard.append(msg)
                if isinstance(msg, Finished):
                    tasks.put(Stop())

            async def main() -> Worker:
                worker = Worker(number, config, "k", {}, loops=10, sandboxes=10, emit=emit)
                for m in messages:
                    tasks.put(m)
                await serve(worker, tasks, RunnerWatch(os.getpid()))
                return worker

            return asyncio.run(main()), heard

        # the worker that meets the 429 says so, and still finishes its prompt
        hit, heard = run_worker(0, Run(item))
        assert [type(m) for m in heard] == [RateLimited, Finished] and heard[0].worker == 0
        assert heard[1].outcome.kind == "done" and hit.limit.limit == 8
        # a worker told of it cuts its own limit as if it had met the 429 itself
        told, _ = run_worker(1, Throttle(), Stop())
        assert told.limit.limit == 8 and told.limit.maximum == 10

    # the run passes it to every other worker, not back to the one that met it
    pool = ProcessPool(config, None, {}, [(10, 10)] * 3, on_outcome=lambda item, outcome: None, say=print)
    ctx = mp.get_context("spawn")
    pool.workers = {n: _Process(n, None, ctx.Queue(), 10, 10) for n in range(3)}
    assert pool._receive(RateLimited(1)) == 0
    time.sleep(0.2)  # a multiprocessing queue hands over through a feeder thread
    got = {n: w.tasks.get(timeout=2) if n != 1 else None for n, w in pool.workers.items()}
    assert isinstance(got[0], Throttle) and isinstance(got[2], Throttle) and pool.workers[1].tasks.empty()


def test_a_malformed_reply_is_retried_like_a_server_error_not_an_internal_error(cli, tmp_path):
    """A 200 whose body is cut-off JSON (a proxy that dropped the rest) is the endpoint's fault:
    the request is retried, and only after --max_retries does the prompt fail, as a server error."""
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"answer": "after two cut-off replies", "fault": {"malformed": True, "times": 2}})},
        {"prompt": script({"answer": "never whole", "fault": {"malformed": True}})},
    ])
    res = cli.run("cut", data, max_retries=3)
    assert res.returncode == 3, res.stderr[-2000:]
    [done] = read_jsonl(cli.run_dir("cut") / "trajectories.jsonl")
    assert done["conversations"][-1]["value"].endswith("after two cut-off replies")
    [failed] = read_jsonl(cli.run_dir("cut") / "failed.jsonl")
    assert failed["error_kind"] == "bad_response" and "not valid JSON" in failed["error"]


def test_ctrl_c_reaches_the_runner_even_from_a_shell_that_ignores_sigint(tmp_path):
    """A job started in the background by a non-interactive shell inherits an ignored SIGINT; the
    test harness (CLI.popen) gives the runner a terminal's disposition back, so the Ctrl-C tests
    mean the same wherever they run. Here the whole harness runs under an ignored SIGINT."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    child = f"""
import os, signal, sys, time
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from tests.conftest import CLI, write_jsonl
from tests.scripted_model import ScriptedModel
tmp = Path({str(tmp_path)!r})
assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # as a background job's
with ScriptedModel(latency=2.0) as model:
    data = write_jsonl(tmp / "d.jsonl", [{{"prompt": f"slow {{i}}"}} for i in range(6)])
    run = CLI(tmp, model).popen("ign", data)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not model.requests:
        time.sleep(0.1)
    os.killpg(run.pid, signal.SIGINT)
    run.communicate(timeout=120)
    print("exit", run.returncode)
"""
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=240,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert "exit 130" in res.stdout, res.stdout + res.stderr[-2000:]
