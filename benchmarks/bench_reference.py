"""The real reference beside this product: the Hermes Agent's own `batch_runner.py`
(hermes-agent 0.19.0 from PyPI, its terminal tool on its local environment) and this product's
`batch_runner.py --backend=local`, on the same dataset against the same scripted server, one after
the other in one invocation.

    python benchmarks/bench_reference.py [--prompts=32] [--workers=4]

Each prompt is one `terminal` call (`echo hello-<hash>`), then an answer; both runs offer the
terminal and file toolsets (the reference's `terminal_only` distribution, the product's
`--toolsets=terminal,file`) with the same number of worker processes. The scripted server runs in
this process (a thread), so it is counted in neither run.

Figures per run: wall time; CPU seconds of the whole process tree (user + system of every process
it started: this process makes itself a child subreaper, so workers their parent never reaps
come back to it, are reaped here and counted in RUSAGE_CHILDREN's delta); peak memory, as the
largest sum of PSS over the tree (a page shared by n processes counts 1/n to each; forked workers
share much) and of RSS (sampled every 50 ms) and the largest single process's max RSS
(from rusage); trajectories written (lines of each run's trajectories.jsonl) and, of them, the ones
completed with the command's output in a tool turn: both must equal the prompts, or the figures are
declared not valid (exit 1). Then the product's figures as ratios of the reference's.

The reference is installed once into the user's cache if it is not there (as `--agent=hermes`
installs it: hermes_batch/harness/install.py), from PyPI.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fire
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from scripted_model import ScriptedModel  # noqa: E402

from hermes_batch.harness.install import installed  # noqa: E402

REFERENCE = "hermes-agent==0.19.0"
PR_SET_CHILD_SUBREAPER = 36


def subreaper() -> None:
    """Orphaned descendants are re-parented to this process (not init), so their CPU can be counted."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def children_cpu() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss


def tree_memory() -> tuple[int, int]:
    """The tree's RSS summed, and its PSS summed (a page shared by n processes counts 1/n to each)."""
    rss = pss = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        pss += info.pss
    return rss, pss


def measure(args: list[str], cwd: Path, env: dict[str, str], log: Path, linger: float = 30.0) -> dict[str, float]:
    """Run one command to its end and every process it left behind (waited up to `linger` s, then
    killed by pid); the figures of the whole tree."""
    peak = [0, 0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss, pss = tree_memory()
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            stop.wait(0.05)

    cpu0, _ = children_cpu()
    sampler = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    sampler.start()
    largest = 0
    code = None
    deadline = None
    while True:  # reap the command and whatever it leaves behind (re-parented here)
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG if code is not None else 0)
        except ChildProcessError:
            break
        if pid == 0:
            if deadline is None:
                deadline = time.monotonic() + linger
            if time.monotonic() > deadline:
                for child in psutil.Process().children():
                    child.kill()  # descendants of the command just run, left over
                deadline = float("inf")
            time.sleep(0.05)
            continue
        largest = max(largest, usage.ru_maxrss)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    cpu1, _ = children_cpu()
    return {"exit": code, "wall, s": wall, "CPU, s": cpu1 - cpu0, "peak PSS of the tree, MiB": peak[1] / 2**20,
            "peak RSS of the tree, MiB": peak[0] / 2**20,
            "largest process max RSS, MiB": largest / 1024}


def lines(path: Path) -> tuple[int, int]:
    """Trajectories written, and of them the ones completed whose tool turn holds the command's output."""
    if not path.exists():
        return 0, 0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    good = sum(1 for row in rows if row.get("completed") and any(
        turn.get("from") == "tool" and "hello-" in str(turn.get("value")) for turn in row.get("conversations", [])))
    return len(rows), good


def main(prompts: int = 32, workers: int = 4) -> None:
    reference = installed("hermes-0.19.0", REFERENCE)
    subreaper()
    model = ScriptedModel(record_requests=False)
    base_url = model.start(0)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="hb-bench-reference-") as tmp:
        work = Path(tmp)
        data = work / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"Task {i}: print a greeting in the shell."}) + "\n"
                                for i in range(prompts)))
        env = {**os.environ, "OPENAI_API_KEY": "k", "PYTHONDONTWRITEBYTECODE": "1"}
        # the reference: its local terminal, its home and its data/ under the temporary directory
        ref_dir = work / "reference"
        (ref_dir / "home").mkdir(parents=True)
        ref_env = {**env, "PYTHONPATH": str(reference), "HERMES_HOME": str(ref_dir / "home"), "TERMINAL_ENV": "local",
                   "TERMINAL_CWD": str(ref_dir)}
        ref_args = [sys.executable, str(reference / "batch_runner.py"), f"--dataset_file={data}", "--run_name=bench",
                    f"--batch_size={max(1, -(-prompts // workers))}", f"--num_workers={workers}",
                    "--distribution=terminal_only", "--model=scripted", "--api_key=k", f"--base_url={base_url}"]
        results["reference"] = measure(ref_args, ref_dir, ref_env, work / "reference.log")
        results["reference"]["trajectories"], results["reference"]["completed, with the output"] = lines(
            ref_dir / "data" / "bench" / "trajectories.jsonl")
        # this product
        own_dir = work / "product"
        own_dir.mkdir()
        own_args = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={data}", "--run_name=bench",
                    f"--output_dir={own_dir / 'data'}", f"--sandbox_root={own_dir / 'sandboxes'}", "--backend=local",
                    f"--num_workers={workers}", "--toolsets=terminal,file", "--model=scripted", "--api_key=k",
                    f"--base_url={base_url}"]
        results["product"] = measure(own_args, own_dir, env, work / "product.log")
        results["product"]["trajectories"], results["product"]["completed, with the output"] = lines(
            own_dir / "data" / "bench" / "trajectories.jsonl")
        failed = []
        for name, figures in results.items():
            if figures["exit"] != 0 or figures["trajectories"] != prompts or figures["completed, with the output"] != prompts:
                failed.append(name)
                log = (work / f"{name}.log").read_text()
                print(f"{name} did not succeed: exit {figures['exit']}, {figures['trajectories']:.0f} of {prompts} "
                      f"trajectories, {figures['completed, with the output']:.0f} completed with the command's output; the end of its output:\n{log[-3000:]}", file=sys.stderr)
    model.stop()
    names = ["wall, s", "CPU, s", "peak PSS of the tree, MiB", "peak RSS of the tree, MiB", "largest process max RSS, MiB", "trajectories",
             "completed, with the output"]
    width = max(map(len, names)) + 2
    print(f"{prompts} prompts (one terminal call, then an answer), {workers} workers each, scripted server on 127.0.0.1")
    print(f"{'':<{width}}{'reference':>12}{'product':>12}{'product/ref':>13}")
    for name in names:
        ref, own = results["reference"][name], results["product"][name]
        ratio = own / ref if ref else float("nan")
        print(f"{name:<{width}}{ref:>12.2f}{own:>12.2f}{ratio:>13.2f}")
    per = {k: results[k]["CPU, s"] / prompts * 1000 for k in results}
    print(f"{'CPU per prompt, ms':<{width}}{per['reference']:>12.1f}{per['product']:>12.1f}"
          f"{per['product'] / per['reference']:>13.2f}")
    if failed:
        print(f"NOT VALID: {', '.join(failed)} did not write all {prompts} trajectories, completed with the command's output (see above)")
        sys.exit(1)


if __name__ == "__main__":
    fire.Fire(main)
