"""--save_workspace and `recheck`: a run's trajectories scored again with fixed checks, from their
saved work trees in fresh sandboxes, without a single model request."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import pytest

from tests.backend_harness import TEST_IMAGE, TEST_SIF, apptainer_status, docker_status, unavailable
from tests.conftest import ROOT, read_jsonl, write_jsonl
from tests.scripted_model import script

BUGGY = {"sum.py": "print(1+2+3)\n"}
FIX = "echo 'print(1+2+3+4)' > sum.py"


def rows(check: str, expected: int) -> list[dict]:
    """The agent fixes sum.py in the first row, not in the second; it answers 42 in the third."""
    return [
        {"prompt": script({"calls": [["terminal", {"command": FIX}]]}, {"answer": "fixed"}, text="fix sum.py"),
         "files": BUGGY, "check": check},
        {"prompt": script({"calls": [["terminal", {"command": "cat sum.py"}]]}, {"answer": "looked"}, text="look"),
         "files": BUGGY, "check": check},
        {"prompt": script({"answer": "the answer is 42"}, text="answer"), "expected": expected},
    ]


def backend_flags(backend: str) -> dict:
    if backend == "docker":
        if why := docker_status():
            unavailable("docker", why)
        return {"backend": "docker", "image": TEST_IMAGE}
    if backend == "singularity":
        if why := apptainer_status():
            unavailable("singularity", why)
        return {"backend": "singularity", "image": TEST_SIF}
    return {}


def recheck(cli, name: str, data, **flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "recheck", f"--run_name={name}",
                           f"--output_dir={cli.out}", f"--dataset_file={data}", *(f"--{k}={v}" for k, v in flags.items())],
                          cwd=cli.workdir, capture_output=True, text=True, timeout=300)


def statuses(cli, name: str) -> list[str]:
    return [r["verification"]["status"] for r in sorted(read_jsonl(cli.run_dir(name) / "trajectories.jsonl"),
                                                        key=lambda r: r["prompt_index"])]


@pytest.mark.parametrize("backend", ["local", "docker", "singularity"])
def test_a_fixed_check_rescores_the_saved_work_without_a_model_request(cli, model, tmp_path, backend):
    flags = backend_flags(backend)
    wrong = write_jsonl(tmp_path / "wrong.jsonl", rows("python3 sum.py | grep -qx 11", 41))
    res = cli.run("w", wrong, save_workspace=True, **flags)
    assert res.returncode == 0, res.stderr[-3000:]
    assert statuses(cli, "w") == ["fail", "fail", "fail"]  # the checks are wrong: the work was right in 1 and 3
    records = sorted(read_jsonl(cli.run_dir("w") / "trajectories.jsonl"), key=lambda r: r["prompt_index"])
    saved = records[0]["metadata"]["workspace"]
    with tarfile.open(fileobj=io.BytesIO((cli.run_dir("w") / saved["file"]).read_bytes())) as tar:
        assert tar.extractfile("./sum.py").read() == b"print(1+2+3+4)\n"  # the agent's work, as it left it
    old_version = records[0]["verification"]["check_version"]
    asked = len(model.requests)

    fixed = write_jsonl(tmp_path / "fixed.jsonl", rows("python3 sum.py | grep -qx 10", 42))
    res = recheck(cli, "w", fixed)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(model.requests) == asked, "recheck asked the model"
    assert "2 verdict(s) changed, 1 the same" in res.stderr, res.stderr
    assert statuses(cli, "w") == ["pass", "fail", "pass"]
    after = sorted(read_jsonl(cli.run_dir("w") / "trajectories.jsonl"), key=lambda r: r["prompt_index"])
    assert after[0]["verification"]["check_version"] not in (None, old_version)
    assert [r["id"] for r in after] == [r["id"] for r in records]  # the same rows: their ids leave checks out
    stats = json.loads((cli.run_dir("w") / "statistics.json").read_text())
    assert stats["verification"]["pass"] == 2 and stats["verification"]["fail"] == 1
    if backend == "local":
        assert not list((tmp_path / "sandboxes").glob("*/*")), "recheck left sandboxes behind"


def test_without_saved_work_a_command_check_keeps_its_verdict_and_says_why(cli, model, tmp_path):
    wrong = write_jsonl(tmp_path / "wrong.jsonl", rows("python3 sum.py | grep -qx 11", 41))
    assert cli.run("n", wrong).returncode == 0
    res = recheck(cli, "n", write_jsonl(tmp_path / "fixed.jsonl", rows("python3 sum.py | grep -qx 10", 42)))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 kept their verdict: their check runs on the work tree, which the run did not save" in res.stderr
    assert statuses(cli, "n") == ["fail", "fail", "pass"]  # the answer check needs no sandbox


def test_recheck_names_what_is_wrong(cli, tmp_path):
    res = recheck(cli, "nothing-here", write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x"}]))
    assert res.returncode != 0 and "no run at" in res.stderr
    res = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "recheck"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert res.returncode != 0 and "--run_name is required" in res.stderr


def test_a_rubric_new_since_is_owed_to_the_judge_and_resume_asks_it(tmp_path):
    """recheck asks no model: a rubric added since makes the verdict an error, which --resume then
    takes to the judge (and only that)."""
    from tests.conftest import CLI
    from tests.scripted_model import ScriptedModel

    def grader(messages):
        return '{"score": 1, "explanation": "shows the steps"}' if "# Rubric" in str(messages) else None

    row = {"prompt": script({"answer": "6*7 = 42"}, text="multiply"), "expected": 42, "match": "contains"}
    with ScriptedModel(grader=grader) as model:
        cli = CLI(tmp_path, model)
        assert cli.run("j", write_jsonl(tmp_path / "a.jsonl", [row])).returncode == 0
        graded = write_jsonl(tmp_path / "b.jsonl", [{**row, "rubric": "The answer shows the multiplication."}])
        res = recheck(cli, "j", graded)
        assert res.returncode == 0 and "1 have a rubric new or changed since" in res.stderr, res.stderr
        assert statuses(cli, "j") == ["error"]
        asked = len(model.requests)
        again = cli.run("j", graded, resume=True)
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(model.requests) == asked + 1  # the judge, once; no agent
    [rec] = read_jsonl(cli.run_dir("j") / "trajectories.jsonl")
    assert rec["verification"]["status"] == "pass" and [c["kind"] for c in rec["verification"]["checks"]] == ["answer", "judge"]


def test_recheck_reads_a_work_tree_only_where_the_run_keeps_them(tmp_path):
    """A record edited to name another file (any path on the host) is not followed, and a file
    over the run's limit is not read."""
    from hermes_batch.runner.recheck import read_workspace
    from hermes_batch.store.run_store import RunStore

    run_dir = tmp_path / "run"
    (run_dir / "workspaces").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.tar.gz"
    elsewhere.write_bytes(b"host file")
    rec = {"id": "abc-0", "metadata": {"workspace": {"file": str(elsewhere)}}}
    store = RunStore(run_dir)
    assert read_workspace(store, rec, 1000) is None  # the run kept none for it: the named path is not read
    (run_dir / "workspaces" / "abc-0.tar.gz").write_bytes(b"kept")
    assert read_workspace(store, rec, 1000) == b"kept"  # the run's own, whatever the record says
    assert read_workspace(store, rec, 3) is None  # over the limit the run kept work trees to
    assert read_workspace(store, {"id": "abc-0", "metadata": {"workspace": {"error": "too big"}}}, 1000) is None
    # an id that climbs out of the run's directory (a review read a host file so)
    (tmp_path / "host.tar.gz").write_bytes(b"host file")
    climbing = {"id": "../../host", "metadata": {"workspace": {"file": "workspaces/x.tar.gz"}}}
    assert read_workspace(store, climbing, 1000) is None
