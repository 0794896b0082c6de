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

from tests.conftest import ROOT

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


def test_the_wheel_holds_the_backends_and_distributions_inside_the_project_s_package(tmp_path):
    source = tmp_path / "src"  # the tracked files only (links kept): a build leaves its build/ there, not here
    for name in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():
            (source / name).symlink_to(os.readlink(ROOT / name))
        else:
            shutil.copy2(ROOT / name, source / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    [wheel] = tmp_path.glob("hermes_batch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hermes_batch/backends/local.py" in names and "hermes_batch/backends/flame_runner.py" in names
    assert "hermes_batch/distributions/default.toml" in names
    assert "hermes_batch/templates/qwen25coder-agent.jinja" in names
    tops = {n.split("/")[0] for n in names}
    assert not tops & set(OURS), sorted(tops)
