from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripted_model import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def pytest_itemcollected(item):
    """The suite runs in two lanes (pytest-xdist, `--dist=loadgroup` in pyproject.toml). A file's
    tests stay in one lane, so its module fixtures (a Ray cluster, a public host's namespace, a
    model server) are made once; the embedded model's tests share a lane, since one of them takes
    both cores and two at once would each run at half speed; and so do Apptainer's, whose
    instances and device nodes are the machine's own (their tests count the instances, and one
    lets an agent change a host device node that every instance's start reads). Marked as each
    test is collected: xdist reads the groups in its own collection hook."""
    if item.get_closest_marker("embedded_model"):
        lane = "embedded-model"
    elif _apptainer(item):
        lane = "apptainer"
    else:
        lane = item.module.__name__
    item.add_marker(pytest.mark.xdist_group(lane))


FIRST_LANES = ("embedded-model", "apptainer")  # the longest lanes, started first


def pytest_collection_modifyitems(config, items):
    """The lanes in the order they are handed out (`--no-loadscope-reorder`): the embedded model's
    first, the longest by far (over half an hour), so the suite never waits for it at the end while
    the other lanes idle; then Apptainer's; then the files with the most tests. The same order on
    every worker, as xdist requires."""
    lanes: dict[str, list] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        lanes.setdefault(marker.args[0] if marker else item.nodeid, []).append(item)

    def rank(lane: str) -> tuple[int, int]:
        return (FIRST_LANES.index(lane), 0) if lane in FIRST_LANES else (len(FIRST_LANES), -len(lanes[lane]))

    items[:] = [item for lane in sorted(lanes, key=rank) for item in lanes[lane]]


def _apptainer(item) -> bool:
    return item.module.__name__.endswith("test_singularity_backend") or any(
        word in item.name.lower() for word in ("singularity", "apptainer"))


@pytest.fixture
def model():
    m = ScriptedModel()
    m.start()
    yield m
    m.stop()


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    # "\n" alone ends a record: str.splitlines() also splits at U+2028 and friends, which JSON keeps raw
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def tool_results_in(record: dict) -> list[dict]:
    """Each tool result of a record, in call order: `{tool_call_id, name, content, images}` (one tool
    turn holds the results of one reply's calls)."""
    from hermes_batch.record import tool_results

    return [r for t in record["conversations"] if t["from"] == "tool" for r in tool_results(t)]


def ledger_ids(run: Path, kind: str = "d") -> list[str]:
    """Ids the run's ledger lists as settled: d done, x discarded, f failed (one line per outcome)."""
    path = run / "ledger.tsv"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [f.split("\t")[1] for f in lines if f.startswith(kind + "\t")]


class CLI:
    """Runs `python batch_runner.py` as a user would, in a scratch directory."""

    def __init__(self, workdir: Path, model: ScriptedModel | None):
        self.workdir = workdir
        self.model = model
        self.out = workdir / "out"

    def args(self, run_name: str, dataset: Path, **flags) -> list[str]:
        base = {
            "dataset_file": str(dataset), "run_name": run_name, "output_dir": str(self.out),
            "model": "scripted", "api_key": "test-key", "num_workers": 2,
            "sandbox_root": str(self.workdir / "sandboxes"),
        }
        if self.model is not None:
            base["base_url"] = self.model.base_url
        base.update(flags)
        return [sys.executable, str(ROOT / "batch_runner.py"), *(_flag(k, v) for k, v in base.items() if v is not None)]

    def run(self, run_name: str, dataset: Path, timeout: float = 180, env: dict | None = None, **flags) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.args(run_name, dataset, **flags), cwd=self.workdir, capture_output=True, text=True,
            timeout=timeout, env={**os.environ, **(env or {})},
        )

    def popen(self, run_name: str, dataset: Path, env: dict | None = None, **flags) -> subprocess.Popen:
        # its own process group, so a test can send it a terminal's Ctrl-C without hitting pytest
        return subprocess.Popen(self.args(run_name, dataset, **flags), cwd=self.workdir, start_new_session=True,
                                env={**os.environ, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_default_sigint)

    def run_dir(self, run_name: str) -> Path:
        return self.out / run_name


def _default_sigint() -> None:
    # a test run started in the background inherits an ignored SIGINT, and Python then keeps it
    # ignored; the runner under test must see Ctrl-C as a terminal would deliver it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _flag(key: str, value) -> str:
    if value is True:
        return f"--{key}"
    if value is False:
        return f"--{key}=False"
    return f"--{key}={value}"


@pytest.fixture
def cli(tmp_path, model):
    return CLI(tmp_path, model)
