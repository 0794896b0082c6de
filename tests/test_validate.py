"""`validate`: a dataset's checks against the untouched task and its reference solution, in real
sandboxes, with no model: broken, trivially passing, flaky and erring checks are found."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, write_jsonl

BUGGY = {"sum.py": "print(1+2+3)\n"}
FIX = "echo 'print(1+2+3+4)' > sum.py"


def validate(tmp_path, data, **flags) -> subprocess.CompletedProcess:
    flags = {"sandbox_root": str(tmp_path / "sandboxes"), **flags}
    return subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "validate", f"--dataset_file={data}",
                           *(f"--{k}={v}" for k, v in flags.items())], capture_output=True, text=True, timeout=300)


def verdicts(out: str) -> dict[str, tuple[str, str, str]]:
    """task → (untouched, solved, verdict), from the printed table."""
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    return {r[1]: (r[2], r[3], r[4]) for r in rows}


def test_validate_finds_broken_trivial_and_erring_checks_and_passes_good_ones(tmp_path):
    rows = [
        {"prompt": "good", "files": BUGGY, "check": "python3 sum.py | grep -qx 10", "reference_solution": FIX},
        {"prompt": "broken", "files": BUGGY, "check": "python3 sum.py | grep -qx 11", "reference_solution": FIX},
        {"prompt": "trivial", "files": BUGGY, "check": "python3 sum.py >/dev/null", "reference_solution": FIX},
        {"prompt": "erring", "check": "sleep 30", "check_timeout": 1, "reference_solution": "true"},
        {"prompt": "setup", "setup": "exit 3", "check": "true", "reference_solution": "true"},
        {"prompt": "untested", "files": BUGGY, "check": "python3 sum.py | grep -qx 10"},
        {"prompt": "hidden", "files": BUGGY, "check": "sh check.sh", "check_files": {"check.sh": "python3 sum.py | grep -qx 10"},
         "reference_solution": FIX},
        {"prompt": "answer only", "expected": 4},  # no command check: not validated
        {"prompt": "half-solved", "check": "test -e made.txt", "reference_solution": "touch made.txt; exit 2"},
        {"prompt": "no check at all"},
    ]
    res = validate(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows))
    assert res.returncode == 1, res.stdout + res.stderr
    assert verdicts(res.stdout) == {
        "good": ("fail,fail", "pass,pass", "ok"),
        "broken": ("fail,fail", "fail,fail", "broken"),
        "trivial": ("pass,pass", "pass,pass", "trivial"),
        "erring": ("fail,fail", "fail,fail", "broken"),  # a check that never ends fails: it cannot pass anything
        "setup": ("error,error", "error,error", "error"),
        "untested": ("fail,fail", "-", "untested"),
        "hidden": ("fail,fail", "pass,pass", "ok"),
        "half-solved": ("fail,fail", "pass,pass", "broken"),  # a review: called ok
    }, res.stdout
    # issue 49: it checked 8 of the rows without saying which it left out, nor why
    assert "validating the checks of 8 of 10 rows (7 with a reference solution) on local" in res.stderr
    assert "not validated: line 8: checked by expected only: nothing runs before an agent answers" in res.stderr
    assert "not validated: line 10: no check: nothing to validate" in res.stderr
    assert "the reference solution exited 2, yet the check passed" in res.stdout
    assert "the row's setup exited 3" in res.stdout and "5 check(s) cannot be trusted" in res.stderr
    fine = validate(tmp_path, write_jsonl(tmp_path / "ok.jsonl", [rows[0], rows[5]]))
    assert fine.returncode == 0 and "1 ok, 1 untested" in fine.stderr, fine.stdout + fine.stderr
    assert not list((tmp_path / "sandboxes").glob("*/*")), "validate left sandboxes behind"


def test_a_check_that_disagrees_with_itself_is_flaky(tmp_path):
    """Unisolated, two runs of one check share the host: the first to take the marker fails, the
    other passes."""
    marker = tmp_path / "taken"
    rows = [{"prompt": "flaky", "check": f"! mkdir {marker} 2>/dev/null", "reference_solution": "true"}]
    res = validate(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows), local_isolation="none")
    assert res.returncode == 1, res.stdout + res.stderr
    assert verdicts(res.stdout)["flaky"][2] == "flaky" and "untouched: " in res.stdout, res.stdout


def test_bad_input_is_named(tmp_path):
    res = validate(tmp_path, write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x", "expected": 1}]))
    assert res.returncode != 0 and "no row has a check to validate" in res.stderr
    bad = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "x", "reference_solution": "true"}])
    res = validate(tmp_path, bad)
    assert "'reference_solution' is there to test the row's check" in res.stderr and res.returncode != 0
    res = validate(tmp_path, bad, no_such_flag=1)
    assert res.returncode != 0 and "unknown flag --no_such_flag" in res.stderr


def test_a_solution_that_fails_is_named_as_the_reason(tmp_path):
    rows = [{"prompt": "unsolved", "files": BUGGY, "check": "python3 sum.py | grep -qx 10",
             "reference_solution": "echo no-such-file >&2; exit 1"}]
    res = validate(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows))
    assert res.returncode == 1 and verdicts(res.stdout)["unsolved"][2] == "broken"
    assert "the reference solution exited 1: no-such-file" in res.stdout, res.stdout
