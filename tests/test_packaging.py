"""What installs is named for the project: `backends/` and `distributions/` stand at the top of the
repository but install as `hermes_batch.backends` and `hermes_batch.distributions`, so they never
collide with another project's top-level package of the same name."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import CLI, ROOT, read_jsonl, write_jsonl
from tests.scripted_model import ScriptedModel

OURS = ("backends", "distributions")


def test_no_code_imports_the_repository_s_top_level_names():
    """From a checkout, `import backends` still works (the repository's root is on sys.path) and
    would load a second copy of every class; installed, it fails. Only the project's names are used."""
    offenders = []
    folders = ("hermes_batch", "backends", "distributions", "tests", "benchmarks")
    for path in [ROOT / "batch_runner.py", *(p for d in folders for p in (ROOT / d).rglob("*.py"))]:
        if "/hermes_batch/backends/" in str(path) or "/hermes_batch/distributions/" in str(path):
            continue  # the links themselves
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OURS]
    assert not offenders, offenders


def tracked_copy(dest: Path) -> Path:
    """The repository's tracked files (links kept) in `dest`: a checkout other than the one installed."""
    for name in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():
            (dest / name).symlink_to(os.readlink(ROOT / name))
        else:
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_the_wheel_holds_the_backends_and_distributions_inside_the_project_s_package(tmp_path):
    source = tracked_copy(tmp_path / "src")  # a build leaves its build/ there, not in the checkout
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    [wheel] = tmp_path.glob("hermes_batch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hermes_batch/backends/local.py" in names and "hermes_batch/backends/flame_runner.py" in names
    assert "hermes_batch/distributions/default.toml" in names
    assert "hermes_batch/llm/templates/qwen25coder-agent.jinja" in names
    tops = {n.split("/")[0] for n in names}
    assert not tops & set(OURS), sorted(tops)


def test_a_checkout_run_as_a_script_runs_its_own_code_in_its_workers(tmp_path):
    """Python 3.11's fork server ignores the parent's sys.path: the workers of a checkout run with
    `python batch_runner.py` imported the installed copy of the package (or nothing at all)."""
    copy = tracked_copy(tmp_path / "copy")
    records = copy / "hermes_batch" / "record" / "outcome.py"
    source = records.read_text()
    mark = 'return datetime.now(UTC).isoformat(timespec="microseconds")'  # record_timestamp's
    assert mark in source
    records.write_text(source.replace(mark, 'return "written-by-the-copy"'))
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    with ScriptedModel() as model:
        cli = CLI(tmp_path, model)
        argv = cli.args("copy", data, num_workers=1)
        argv[1] = str(copy / "batch_runner.py")
        res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    [rec] = read_jsonl(cli.run_dir("copy") / "trajectories.jsonl")
    assert rec["metadata"]["timestamp"] == "written-by-the-copy"  # made in a worker
