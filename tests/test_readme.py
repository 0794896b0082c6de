"""README's commands run as pasted: the quick start on the embedded model, then every everyday
command after it, in order, in a checkout of their own (as a new user's would be)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from tests.backend_harness import REQUIRED
from tests.conftest import ROOT, read_jsonl, tool_results_in
from tests.test_packaging import tracked_copy

README = (ROOT / "README.md").read_text(encoding="utf-8")


def bash_blocks(section: str) -> list[str]:
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", body, re.S)


def commands(block: str) -> list[str]:
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def needs_the_embedded_model() -> None:
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        if "local-model" in REQUIRED:
            pytest.fail("the embedded model is required here (HERMES_BATCH_REQUIRE_BACKENDS) but not installed")
        pytest.skip("the embedded model is not installed (pip install -e '.[local]')")


def run_as_pasted(checkout, command: str) -> None:
    argv = shlex.split(command)
    assert argv[0] == "python", command
    res = subprocess.run([sys.executable, *argv[1:]], cwd=checkout, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"


def test_the_readme_names_only_extras_that_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = re.findall(r"pip install -e '\.\[([a-z,]+)\]'", README)
    assert named and all(name in extras for group in named for name in group.split(",")), named


@pytest.mark.embedded_model
def test_the_quick_start_and_every_command_after_it_run_as_pasted(tmp_path):
    needs_the_embedded_model()
    checkout = tracked_copy(tmp_path / "hermes-batch")
    [setup] = bash_blocks("Quick start")[:1]
    quick = setup.strip().rsplit(" && ", 1)[1]  # what follows the set-up (bubblewrap, venv, pip)
    assert quick.startswith("python batch_runner.py ")
    everyday = commands(bash_blocks("Everyday commands")[0])
    assert any(c.startswith("python batch_runner.py export") for c in everyday)
    for command in [quick, *everyday]:
        if command.startswith("pip install "):
            continue  # the test's environment has every extra (test_the_readme_names_only_extras_that_exist)
        run_as_pasted(checkout, command)
    run = checkout / "data" / "quickstart"
    assert len(read_jsonl(run / "trajectories.jsonl")) == 6  # four, then two more on --resume
    assert len(read_jsonl(checkout / "train.jsonl")) >= 1 and (run / "report.html").exists()
    # the cleaning export: the first prompt is the checked examples' first task, left out as contaminated
    clean = read_jsonl(checkout / "clean.jsonl")
    assert 4 <= len(clean) <= 5 and (checkout / "clean.README.md").exists()
    assert not any(r["messages"][1]["content"].startswith("Create a file numbers.txt") for r in clean)


@pytest.mark.embedded_model
def test_the_checked_run_runs_as_pasted_and_every_record_carries_a_verdict(tmp_path):
    needs_the_embedded_model()
    checkout = tracked_copy(tmp_path / "hermes-batch")
    [block] = bash_blocks("Checked runs")
    for command in commands(block):
        run_as_pasted(checkout, command)
    records = read_jsonl(checkout / "data" / "checked" / "trajectories.jsonl")
    assert len(records) == 6 and all(r["verification"]["status"] in ("pass", "fail") for r in records)
    passed = read_jsonl(checkout / "passed.jsonl") if (checkout / "passed.jsonl").exists() else []
    assert len(passed) == sum(r["verification"]["status"] == "pass" for r in records)


@pytest.mark.embedded_model
def test_the_browser_run_runs_as_pasted_and_the_agent_browses(tmp_path):
    needs_the_embedded_model()
    from tests.test_browser import needs_a_browser

    needs_a_browser("local")
    checkout = tracked_copy(tmp_path / "hermes-batch")
    [block] = bash_blocks("Browsing")
    for command in commands(block):
        run_as_pasted(checkout, command)
    records = read_jsonl(checkout / "data" / "browse" / "trajectories.jsonl")
    assert len(records) == 3 and all(r["verification"]["status"] in ("pass", "fail") for r in records)
    for r in records:  # every prompt drove the browser (a small model's choices vary: not always well)
        assert sum(s["count"] for n, s in r["tool_stats"].items() if n.startswith("browser_")) >= 1, r["tool_stats"]
    opened = [t for r in records for t in tool_results_in(r) if t["name"] == "browser_navigate"
              and '"success": true' in t["content"]]
    assert opened and all("file:///workspace/" in t["content"] for t in opened)  # pages in the sandbox's Chromium
    assert (checkout / "data" / "browse" / "report.html").exists()


@pytest.mark.embedded_model
def test_the_mcp_run_runs_as_pasted_and_the_agent_asks_the_server(tmp_path):
    needs_the_embedded_model()
    checkout = tracked_copy(tmp_path / "hermes-batch")
    [block] = bash_blocks("Tools from MCP servers")
    for command in commands(block):
        if command.startswith("python "):  # (the pip line installed what this environment has)
            run_as_pasted(checkout, command)
    records = read_jsonl(checkout / "data" / "mcp" / "trajectories.jsonl")
    assert len(records) == 3 and all(r["verification"]["status"] in ("pass", "fail") for r in records)
    asked = [r["tool_stats"]["facts__lookup"]["success"] for r in records]
    assert sum(asked) >= 2, asked  # the small model asks the row's own server (its answers vary: not always)


@pytest.mark.embedded_model
def test_the_token_exact_run_runs_as_pasted_and_its_rows_are_the_model_s_tokens(tmp_path):
    needs_the_embedded_model()
    checkout = tracked_copy(tmp_path / "hermes-batch")
    [block] = bash_blocks("Token-exact rollouts")
    for command in commands(block):
        run_as_pasted(checkout, command)
    records = read_jsonl(checkout / "data" / "exact" / "trajectories.jsonl")
    rows = read_jsonl(checkout / "tokens.jsonl")
    assert len(records) == 3 and all(r["tokens"]["mode"] == "exact" for r in records)
    assert all(r["verification"]["status"] in ("pass", "fail") for r in records)
    assert len(rows) == sum(r["tokens"]["segments"] for r in records)
    for row in rows:
        assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"]) and sum(row["loss_mask"]) > 0
    stats = json.loads((checkout / "data" / "exact" / "statistics.json").read_text())["token_exact"]
    assert stats["trajectories"] == 3 and stats["model_calls"] >= 3
    assert {row["reward"] for row in rows} <= {0.0, 1.0}  # the verdict's score, on every segment


def test_the_evaluation_commands_run_as_pasted_against_an_endpoint(tmp_path):
    """The section names hosted models; here a scripted endpoint stands in for them (the same
    flags, the endpoint's address added), and every command must succeed as written."""
    from tests.scripted_model import ScriptedModel

    checkout = tracked_copy(tmp_path / "hermes-batch")
    [block] = bash_blocks("Evaluations and curated data")
    with ScriptedModel() as model:
        for command in commands(block):
            if "--model=" in command:
                command += f" --base_url={model.base_url} --api_key=test --toolsets=terminal,file --num_workers=1"
            run_as_pasted(checkout, command)
    runs = [read_jsonl(checkout / "data" / name / "trajectories.jsonl") for name in ("eval-a", "eval-b")]
    assert [len(r) for r in runs] == [24, 24] and all(r["samples"] == 4 for run in runs for r in run)
    assert (checkout / "data" / "compare-eval-a-eval-b.html").exists()
    assert (checkout / "sft.jsonl").exists() and (checkout / "dpo.jsonl").exists()


@pytest.mark.embedded_model
def test_the_trl_lines_train_as_written(tmp_path):
    """The section's Python, as written, with the test's tiny policy (tests/tiny_policy.py) as
    `policy` and `tokenizer`, its vocabulary for the server, and one step instead of fifty."""
    from tests.test_rl import needs_rl

    needs_rl()
    [block] = re.findall(r"```python\n(.*?)```", README.split("\n## Training with TRL\n", 1)[1].split("\n## ", 1)[0], re.S)
    assert 'model="local"' in block and "max_steps=50" in block
    code = (block.replace('model="local"', 'model="local", vocabulary=tiny_policy.vocabulary_gguf(Path("vocab.gguf")), '
                                           'sandbox_root="sandboxes", num_workers=1')
            .replace("max_steps=50", "max_steps=1, use_cpu=True, report_to=[]"))
    checkout = tracked_copy(tmp_path / "hermes-batch")
    script = ("import os, sys\nfrom pathlib import Path\nos.environ['TRL_EXPERIMENTAL_SILENCE'] = '1'\n"
              f"sys.path.insert(0, {str(ROOT)!r})\nfrom tests import tiny_policy\n"
              "if __name__ == '__main__':\n    policy, tokenizer = tiny_policy.policy(), tiny_policy.tokenizer()\n"
              + "".join(f"    {line}\n" for line in code.splitlines()))
    (checkout / "train.py").write_text(script)
    res = subprocess.run([sys.executable, "train.py"], cwd=checkout, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    records = read_jsonl(checkout / "data" / "grpo" / "steps" / "000000-train-0" / "trajectories.jsonl")
    assert len(records) == 8 and all(r["metadata"]["model"] == "local:policy-v000000" for r in records)
    assert (checkout / "data" / "grpo" / "policy" / "policy-v000001.gguf").exists()  # the step's weights, for the next
