"""The command line as a user meets it: flags, bad input and bad configuration, clear messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.conftest import ROOT, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel, script


def test_list_distributions_prints_every_distribution_with_probabilities():
    res = subprocess.run([sys.executable, "batch_runner.py", "--list_distributions"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for name in ("default", "development", "research", "terminal_only", "code_only", "offline"):
        assert f"{name}:" in res.stdout
    assert "terminal     100%   (terminal, process)" in res.stdout
    assert "web           30%   (web_search, web_extract)" in res.stdout


def test_help_lists_every_flag():
    res = subprocess.run([sys.executable, "batch_runner.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for flag in ("--dataset_file", "--resume", "--backend", "--concurrency", "--max_sandboxes", "--keep_flame_sessions"):
        assert flag in res.stdout
    assert "--max_turns                  10" in res.stdout


def test_bad_flags_and_values_are_rejected_clearly(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    cases = [
        ({"batch_size": 0}, "--batch_size=0: Input should be greater than or equal to 1"),
        ({"backend": "kubernetes"}, "--backend='kubernetes'"),
        ({"distribution": "nope"}, "unknown distribution 'nope'; available: balanced"),
        ({"toolsets": "terminal,telepathy"}, "unknown toolset(s) in --toolsets: telepathy"),
        ({"provider_sort": "cheapest"}, "--provider_sort='cheapest'"),
        ({"reasoning_effort": "huge"}, "--reasoning_effort='huge'"),
        ({"run_name": "../escape"}, "--run_name='../escape'"),
        ({"dataset_file": str(tmp_path / "missing.jsonl")}, "dataset file not found"),
        ({"prefill_messages_file": str(tmp_path / "nope.json")}, "prefill_messages_file not found"),
    ]
    for flags, message in cases:
        res = cli.run(flags.pop("run_name", "r"), flags.pop("dataset_file", data), **flags)
        assert res.returncode == 1, (flags, res.stderr)
        assert message in res.stderr, (message, res.stderr)
    served = cli.model.served
    res = cli.run("r", data, num_worker=3)  # a typo is refused before anything runs
    assert res.returncode == 1 and "unknown flag --num_worker (did you mean --num_workers?)" in res.stderr
    assert cli.model.served == served and not cli.run_dir("r").exists()


def test_bad_rows_are_reported_by_line_and_skipped(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "good one"},
        "{not json",
        {"text": "no prompt field"},
        {"prompt": 42},
        "",
        {"prompt": "good two", "image": ""},
        ["a", "list"],
        {"prompt": "good three", "topic": "math"},
    ])
    res = cli.run("rows", data, require_reasoning=False)
    assert res.returncode == 0, res.stderr
    assert "d.jsonl:2: invalid JSON" in res.stderr
    assert "d.jsonl:3: missing the required field 'prompt'" in res.stderr
    assert "d.jsonl:4: 'prompt' must be a string, got int" in res.stderr
    assert "d.jsonl:6: 'image' must be a non-empty string" in res.stderr
    assert "d.jsonl:7: expected a JSON object, got list" in res.stderr
    records = read_jsonl(cli.run_dir("rows") / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in records] == ["good one", "good three"]
    assert records[1]["metadata"]["dataset"] == {"topic": "math"}


def test_with_no_web_provider_no_web_tool_is_offered(cli, tmp_path):
    import json

    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(4)])
    res = cli.run("web", data)  # the default distribution offers every toolset, web, vision, image_gen included
    assert res.returncode == 0 and "offers no web tools in this run" in res.stderr
    records = read_jsonl(cli.run_dir("web") / "trajectories.jsonl")
    from hermes_batch.tools.browser import chromium_on_host, driver_ready

    browser = ["browser"] if driver_ready() and chromium_on_host() else []  # offered where it can run
    assert [r["toolsets_used"] for r in records] == [[*browser, "code", "file", "terminal"]] * 4
    assert not any({"web_search", "web_extract"} & set(r["metadata"]["tools_offered"]) for r in records)
    left_out = json.loads((cli.run_dir("web") / "statistics.json").read_text())["toolsets_left_out"]
    assert left_out == sorted(["image_gen", "vision", "web", *({"browser"} - set(browser))])
    res = cli.run("noweb", data, distribution="offline")
    assert res.returncode == 0 and "web" not in res.stderr.split("prompts in")[0]
    res = cli.run("onlyweb", data, toolsets="web,terminal")
    assert res.returncode == 1 and "--toolsets includes web, but no web provider is configured" in res.stderr
    only_web = tmp_path / "only_web.toml"
    only_web.write_text('description = "web"\n[toolsets]\nweb = 100\n')
    res = cli.run("onlyweb2", data, distribution=str(only_web))
    assert res.returncode == 1 and "offers nothing this run can offer: web: no web provider" in res.stderr
    assert not (cli.run_dir("onlyweb") / "batch_0.jsonl").exists()


def test_a_dataset_with_no_usable_row_is_an_error(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", ["{", {"q": 1}])
    res = cli.run("empty", data)
    assert res.returncode == 1 and "has no usable rows (2 rejected)" in res.stderr


def test_wrong_api_key_stops_the_run_at_once(tmp_path):
    model = ScriptedModel(api_key="the-right-key")
    model.start()
    try:
        from tests.conftest import CLI

        cli = CLI(tmp_path, model)
        data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(50)])
        started = time.monotonic()
        res = cli.run("badkey", data, api_key="wrong")
        took = time.monotonic() - started
    finally:
        model.stop()
    assert res.returncode == 1
    assert "rejected the API key" in res.stderr and "HTTP 401" in res.stderr
    assert took < 30
    assert not read_jsonl(cli.run_dir("badkey") / "failed.jsonl")  # nothing burned as failed


def test_dead_endpoint_is_a_clear_error(tmp_path):
    from tests.conftest import CLI

    cli = CLI(tmp_path, None)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    res = cli.run("dead", data, base_url="http://127.0.0.1:9/v1")
    assert res.returncode == 1
    assert "cannot reach the model endpoint http://127.0.0.1:9/v1" in res.stderr


def test_an_existing_run_is_not_silently_mixed_into(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    assert cli.run("again", data).returncode == 0
    res = cli.run("again", data)
    assert res.returncode == 1 and "already holds a run; pass --resume" in res.stderr
    res = cli.run("again", data, overwrite=True)
    assert res.returncode == 0
    assert len(read_jsonl(cli.run_dir("again") / "trajectories.jsonl")) == 1


def test_two_runs_cannot_write_one_run_directory(cli, tmp_path):
    from hermes_batch.store.run_store import RunStore

    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    holder = RunStore(cli.run_dir("busy"))
    holder.lock()
    try:
        res = cli.run("busy", data)
    finally:
        holder.close()
    assert res.returncode == 1 and "is in use by pid" in res.stderr


def test_the_flags_reference_documents_every_flag():
    """Every flag is in docs/flags.md (the README, a page for the first hour, links to it)."""
    from hermes_batch.backends import all_flags
    from hermes_batch.cli import ACTIONS
    from hermes_batch.config import flags

    reference = (ROOT / "docs" / "flags.md").read_text()
    missing = [p for p in [*flags(), *all_flags(), *ACTIONS] if p != "help" and f"`{p}`" not in reference]
    assert not missing, f"flags missing from docs/flags.md: {missing}"



def test_only_backends_that_run_images_fingerprint_one_and_older_flame_runs_still_resume():
    import pytest

    from hermes_batch.config import ConfigError, RunConfig, check_fingerprint, fingerprint
    from hermes_batch.tools import schema_hash

    def config(**kw):
        return RunConfig(run_name="fp", dataset_file="d.jsonl", **kw)

    assert "image" in config(backend="docker").fingerprint_fields("h")
    for backend in ("flame", "local"):
        assert "image" not in config(backend=backend).fingerprint_fields("h")
    # a Flame run fingerprinted (before) with the image it never used resumes; a changed model does not
    flame = config(backend="flame")
    before = fingerprint({**flame.fingerprint_fields(schema_hash(flame.offered_toolsets())), "image": flame.sandbox.image})
    check_fingerprint(flame, {"config_fingerprint": before, "config": flame.stored()}, set())
    with pytest.raises(ConfigError, match="model"):
        check_fingerprint(config(backend="flame", model="other"), {"config_fingerprint": before, "config": flame.stored()}, set())


# Checkpoints written before the backends declared their own flags (at bf9575f): every flag stored
# flat, those of every backend included; with that version's tool schemas (3cd12987ea0a).
_OLD_STORED = {
    "dataset_file": "d.jsonl", "run_name": "fp", "output_dir": "data", "batch_size": 10, "num_workers": 4,
    "concurrency": 64, "max_sandboxes": None, "max_samples": None, "executor": "local", "ray_address": None,
    "model": "anthropic/claude-sonnet-4.6", "base_url": "https://openrouter.ai/api/v1", "max_turns": 10,
    "max_tokens": None, "temperature": None, "first_tool_choice": "auto", "reasoning_effort": None,
    "reasoning_disabled": False, "providers_allowed": None, "providers_ignored": None, "providers_order": None,
    "provider_sort": None, "ephemeral_system_prompt": None, "prefill_messages_file": None, "prefill_messages": None,
    "request_timeout": 600.0, "max_retries": 6, "prompt_timeout": 3600.0, "max_cost": None, "max_total_tokens": None,
    "max_attempts": 3, "distribution": "default", "toolsets": None, "require_reasoning": True, "command_timeout": 180.0,
    "web_provider": None, "web_base_url": None, "web_search_url": None, "backend": "local", "image": "python:3.12-slim",
    "network": False, "memory": "1g", "cpus": 1.0, "pids_limit": 256, "runtime": None, "sandbox_root": None,
    "local_isolation": "bwrap", "keep_flame_sessions": False, "flame_id_scheme": "run", "local_model": None,
    "local_threads": None, "local_ctx": 8192, "local_parallel": 2,
}
_OLD_RUNS = [
    ({"backend": "local"}, "321b5b314b87b896"),
    ({"backend": "docker", "image": "python:3.11", "memory": "2g"}, "4e4f6a4aee40a333"),
    ({"backend": "flame", "keep_flame_sessions": True}, "e52887b3d3745270"),
]


def test_runs_started_before_the_backends_owned_their_flags_resume_with_their_settings(tmp_path, monkeypatch):
    import pytest

    from hermes_batch.config import ConfigError, check_fingerprint, configure

    # those runs' default distribution could offer no browser; here neither (no driver in this cache)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-browser-driver"))

    tools = "3cd12987ea0a"  # those runs' tool definitions
    for changes, old_fp in _OLD_RUNS:
        stored = {**_OLD_STORED, **changes}
        checkpoint = {"config_fingerprint": old_fp, "config": stored}
        (tmp_path / "fp").mkdir(exist_ok=True)
        (tmp_path / "fp" / "checkpoint.json").write_text(json.dumps(checkpoint))
        config = configure({"run_name": "fp", "output_dir": str(tmp_path), "resume": True})
        check_fingerprint(config, checkpoint, set(), tools)  # the same fingerprint: no refusal
        assert config.backend == changes["backend"]
        assert config.sandbox.flags().items() >= {k: v for k, v in changes.items() if k != "backend"}.items()
        with pytest.raises(ConfigError, match="max_turns"):  # and a changed setting is still refused
            check_fingerprint(config.model_copy(update={"max_turns": 3}), checkpoint, set(), tools)


def test_output_into_a_closed_pipe_neither_traces_back_nor_stops_the_run(cli, tmp_path):
    """`--help | head` ended in a BrokenPipeError traceback, and a run piped into `| head` died
    silently when head went away."""
    import shlex

    res = subprocess.run(f"{shlex.join([sys.executable, str(ROOT / 'batch_runner.py'), '--help'])} | head -1; "
                         "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True, text=True)
    assert res.returncode == 0 and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"pipe {i}"} for i in range(6)])
    argv = shlex.join(cli.args("piped", data, require_reasoning=False))
    res = subprocess.run(f"{argv} 2>&1 | head -1; exit ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash",
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(read_jsonl(cli.run_dir("piped") / "trajectories.jsonl")) == 6  # it ran to the end


def test_a_prefill_file_that_is_not_utf8_is_named_with_its_flag(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    prefill = tmp_path / "prefill.json"
    prefill.write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    res = cli.run("pf", data, prefill_messages_file=str(prefill))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"--prefill_messages_file={prefill} is not UTF-8 text" in res.stderr, res.stderr


def test_help_names_the_choices_of_every_flag_with_a_fixed_set():
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "--help"], capture_output=True, text=True)
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.startswith("  --")}
    assert "firecrawl, tavily, exa, brave, searxng, ddgs" in lines["--web_provider"]
    assert "local, ray" in lines["--executor"] and "auto, required" in lines["--first_tool_choice"]
    assert "price, throughput, latency" in lines["--provider_sort"] and "bwrap, none" in lines["--local_isolation"]


def test_a_run_leaves_no_directory_behind_in_the_sandbox_root(cli, tmp_path):
    """Each run left an empty directory of its own under /tmp/hermes-batch."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "leave nothing"}])
    res = cli.run("clean", data, require_reasoning=False, toolsets="terminal")
    assert res.returncode == 0, res.stderr[-2000:]
    assert cli.model.served >= 2  # the default scripted prompt ran a command: a sandbox was made
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_a_path_that_cannot_be_made_is_one_line_not_a_traceback(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    res = cli.run("p", data, output_dir="/proc/1", require_reasoning=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "error: cannot create, read or write /proc/1/p" in res.stderr, res.stderr[-1500:]
    res = cli.run("p", data, sandbox_root="/proc/1/sandboxes", require_reasoning=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr and "/proc/1/sandboxes" in res.stderr, res.stderr[-1500:]
    assert cli.run("ok", data, require_reasoning=False).returncode == 0
    for command, target in (("export", "/proc/1/x.jsonl"), ("view", "/proc/1/r.html")):
        res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), command, "--run_name=ok",
                              f"--output_dir={cli.out}", f"--output={target}"], capture_output=True, text=True)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-1500:]
        assert "error: cannot create, read or write /proc/1/" in res.stderr


def test_a_proxy_never_carries_requests_to_this_machine_and_is_named_when_it_fails(cli, tmp_path):
    """With http_proxy/https_proxy set (most corporate machines), requests to the embedded model's
    server on 127.0.0.1 went to the proxy and the run failed, naming neither."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "through no proxy"}])
    dead = "http://127.0.0.1:9"
    env = {name: dead for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy")}
    res = cli.run("loopback", data, env=env, require_reasoning=False)
    assert res.returncode == 0, res.stderr[-2000:]
    res = cli.run("hosted", data, env=env, base_url="http://model.example.test/v1", require_reasoning=False)
    assert res.returncode == 1 and f"through the proxy {dead}" in res.stderr, res.stderr[-2000:]


def test_a_resume_says_its_table_is_the_whole_run_s(cli, tmp_path):
    """After --resume, 'this invocation: 1 done' was followed by the whole run's tool table,
    without saying so."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
    assert cli.run("whole", data, max_samples=1).returncode == 0
    res = cli.run("whole", data, resume=True, max_samples=2)
    assert res.returncode == 0, res.stderr[-2000:]
    after = res.stderr.split("this invocation: 1 done, 0 discarded, 0 failed", 1)[1]
    assert after.lstrip().startswith("across the whole run:") and "2 trajectories in" in after


def test_tool_descriptions_of_ones_own_replace_the_tools_and_are_part_of_the_run(cli, model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"terminal": "Runs a command in bash. (My own words.)"}))
    res = cli.run("described", data, toolsets="terminal,file", tool_descriptions=str(mine), require_reasoning=False)
    assert res.returncode == 0, res.stderr[-2000:]
    sent = {t["function"]["name"]: t["function"]["description"] for t in model.requests[-1]["tools"]}
    assert sent["terminal"] == "Runs a command in bash. (My own words.)"
    assert sent["read_file"].startswith("Read")  # the others keep their own
    [record] = read_jsonl(cli.run_dir("described") / "trajectories.jsonl")
    assert "(My own words.)" in record["conversations"][0]["value"]  # the record's system turn lists the tools
    mine.write_text(json.dumps({"terminal": "Other words."}))
    res = cli.run("described", data, resume=True)  # the file is read again: a change is seen, and refused
    assert res.returncode == 1 and "the tool definitions" in res.stderr, res.stderr[-2000:]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"termnal": "typo"}))
    res = cli.run("bad", data, tool_descriptions=str(bad))
    assert res.returncode != 0 and "names no such tool: termnal" in res.stderr
    bad.write_text("[1]")
    res = cli.run("bad2", data, tool_descriptions=str(bad))
    assert res.returncode != 0 and "must hold a JSON object" in res.stderr


# --- a new user's first hour (issue 49) --------------------------------------------------------
def test_resume_with_another_dataset_is_refused_and_a_reused_name_does_not_lead_into_it(cli, tmp_path):
    """Issue 49: `--resume` with another --dataset_file added its prompts to the run (two datasets in
    one), and the error for a reused name told the user to pass --resume."""
    first = write_jsonl(tmp_path / "first.jsonl", [{"prompt": "p1"}])
    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": "q1"}, {"prompt": "q2"}])
    assert cli.run("mine", first).returncode == 0
    res = cli.run("mine", other)
    assert res.returncode == 1 and "already holds a run of another dataset (1 trajectories of" in res.stderr
    assert "choose another --run_name" in res.stderr and "pass --resume" not in res.stderr, res.stderr
    res = cli.run("mine", other, resume=True)
    assert res.returncode == 1 and "resuming would mix two datasets in one run" in res.stderr, res.stderr[-2000:]
    assert len(read_jsonl(cli.run_dir("mine") / "trajectories.jsonl")) == 1
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(first.read_bytes())  # the same dataset under another name
    for dataset in (None, moved):
        res = cli.run("mine", dataset, resume=True, dataset_file=dataset and str(dataset))
        assert res.returncode == 0 and "1 already done" in res.stderr, res.stderr[-2000:]
    res = cli.run("mine", other, resume=True, allow_config_change=True)  # asked for in so many words
    assert res.returncode == 0 and len(read_jsonl(cli.run_dir("mine") / "trajectories.jsonl")) == 3


def test_a_run_that_ended_before_any_prompt_did_holds_no_name(cli, tmp_path):
    """Issue 49: a run that failed before doing anything (here: its endpoint unreachable) kept its
    name: the fixed command was refused, and --resume refused as a change of settings."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    for fixed in ({}, {"resume": True}):
        failed = cli.run("early", data, base_url="http://127.0.0.1:9/v1", model="another-model")
        assert failed.returncode == 1 and "cannot reach the model endpoint" in failed.stderr, failed.stderr[-2000:]
        res = cli.run("early", data, **fixed)
        assert res.returncode == 0, res.stderr[-2000:]
        said = "starting it afresh" if not fixed else "holds no trajectory yet, so it goes on with the settings given now"
        assert said in res.stderr
        assert len(read_jsonl(cli.run_dir("early") / "trajectories.jsonl")) == 1
        cli.run("early", data, overwrite=True, base_url="http://127.0.0.1:9/v1")  # (emptied for the next round)


def test_resume_of_a_run_that_does_not_exist_says_so(cli, tmp_path):
    res = cli.run("no-such-run", None, resume=True, dataset_file=None)
    assert res.returncode == 1
    assert "no run named 'no-such-run' to resume" in res.stderr and "dataset_file is required" not in res.stderr


def test_a_backend_that_cannot_work_is_refused_before_the_embedded_model_starts(tmp_path):
    """Issue 49: --backend=docker with no engine was reported only after the embedded model had
    warmed up (144-155 s). A stand-in weights file: the model must not even be started."""
    from tests.conftest import CLI

    weights = tmp_path / "never-loaded.gguf"
    weights.write_bytes(b"GGUF" + bytes(64))
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    started = time.monotonic()
    res = CLI(tmp_path, None).run("nodocker", data, model="local", local_model=str(weights), backend="docker",
                                  env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert res.returncode == 1 and "cannot reach the Docker engine" in res.stderr, res.stderr[-2000:]
    assert "local model" not in res.stderr
    assert time.monotonic() - started < 60


def test_a_run_whose_output_is_no_terminal_says_how_it_goes_every_few_seconds(cli, tmp_path):
    """Issue 49: with stderr in a log file, nothing was printed for minutes (tqdm draws on terminals only)."""
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"calls": [["terminal", {"command": "sleep 11; echo slept"}]]}, {"answer": "{last_tool}"})}])
    res = cli.run("slow", data, require_reasoning=False)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("slow: ")]
    assert lines[0].startswith("slow: 0/1 prompts settled (0 done, 0 discarded, 0 failed), 1 in flight"), res.stderr
    assert len(lines) >= 2 and all(" s, " in line and "tok/s" in line for line in lines), lines


def test_the_browser_s_prepare_command_runs_its_module_once_and_warns_of_nothing():
    """Issue 49: `python -m hermes_batch.tools.browser prepare` printed a RuntimeWarning (the module,
    imported with its package, was run a second time as the script)."""
    res = subprocess.run([sys.executable, "-m", "hermes_batch.tools.browser"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode != 0 and "usage: python -m hermes_batch.tools.browser prepare" in res.stderr
    assert "Warning" not in res.stderr, res.stderr


def test_the_run_s_children_usage_holds_its_workers_cpu(cli, tmp_path):
    """Issue 49: `/usr/bin/time` saw about a sixth of a run's CPU: the workers (children of the fork
    server) were never reaped through the run's process. Here a prompt's command, a child of its
    worker (--local_isolation=none), burns 4 s of CPU; the run's usage, as its parent reads it,
    must hold them. (A bubblewrap jail's commands never count: bwrap does not wait for a jail's
    PID 1; nor do a container's.)"""
    import resource

    burn = ("python3 -c 'import time; t = time.process_time(); "
            "[0 for _ in iter(lambda: time.process_time() - t < 4, False)]; print(\"burnt\", 6 * 7)'")
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": script({"calls": [["terminal", {"command": burn}]]}, {"answer": "{last_tool}"})}])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = cli.run("cpu", data, require_reasoning=False, num_workers=1, local_isolation="none")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "burnt 42" in read_jsonl(cli.run_dir("cpu") / "trajectories.jsonl")[0]["conversations"][-1]["value"]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert cpu >= 4.0, cpu


def test_the_fork_server_ends_even_when_another_process_holds_its_pipe():
    """Issue 49: the fork server outlived the run once in 39 runs. It is ended and reaped at the
    run's end, killed if something else keeps its pipe from the run open."""
    code = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from multiprocessing import forkserver
from hermes_batch.runner.executor import stop_fork_server, warm_up
warm_up()
server = forkserver._forkserver._forkserver_pid
holder = os.fork()  # keeps every descriptor of the run's, the server's pipe among them
if holder == 0:
    time.sleep(30)
    os._exit(0)
started = time.monotonic()
stop_fork_server(grace=1.0)
print(server, round(time.monotonic() - started, 1))
os.kill(holder, 9)
"""
    res = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    server, took = res.stdout.split()
    assert not os.path.exists(f"/proc/{server}") and float(took) < 5, res.stdout
