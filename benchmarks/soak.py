"""Soak: thousands of prompts against an endpoint that misbehaves, the runner killed with SIGKILL
again and again and resumed, then a check that every prompt is in the output exactly once.

    python benchmarks/soak.py [--prompts=5000] [--kills=5] [--chaos=0.05] [--concurrency=64] [--workers=2]

The scripted endpoint (tests/scripted_model.py) gives each request, with probability `chaos`, one
fault: 429 with and without Retry-After, 500, 503, a reply that stalls past the request timeout,
a dropped connection, a malformed body. One prompt in five makes a `terminal` call (local backend)
before its answer. The runner is killed `kills` times at a random moment (SIGKILL to the runner
alone, as `kill -9 <pid>` does), then `--resume` runs until the run exits 0. It prints the faults
injected, the invocations, and what was lost or duplicated (both must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import ledger_ids  # noqa: E402
from tests.scripted_model import ScriptedModel, script  # noqa: E402


def _rows(prompts: int) -> list[dict]:
    rows = []
    for i in range(prompts):
        turns = ([{"calls": [["terminal", {"command": f"echo soak-{i}"}]]}] if i % 5 == 0 else [])
        rows.append({"prompt": script(*turns, {"answer": f"answer {i}"}, text=f"Soak task {i}.")})
    return rows


def _settled(run_dir: Path) -> int:
    """Prompts settled so far: the ledger's lines but its fingerprint (`p`) lines."""
    path = run_dir / "ledger.tsv"
    return sum(not line.startswith("p\t") for line in path.read_text().splitlines()) if path.exists() else 0


def _ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def soak(workdir: Path, *, prompts: int, kills: int, chaos: float, concurrency: int = 64, workers: int = 2,
         seed: int = 0, latency: float = 0.02) -> dict:
    """Run the soak in `workdir`; returns its figures (and raises nothing: the caller checks them)."""
    rng = random.Random(seed)
    dataset = workdir / "soak.jsonl"
    with open(dataset, "w", encoding="utf-8") as f:
        for row in _rows(prompts):
            f.write(json.dumps(row) + "\n")
    out = workdir / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    invocations, codes = 0, []
    with ScriptedModel(latency=latency, chaos=chaos, chaos_seed=seed, chaos_stall=3.0) as model:
        argv = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--run_name=soak",
                f"--output_dir={out}", f"--base_url={model.base_url}", "--model=scripted", "--api_key=soak",
                f"--num_workers={workers}", f"--concurrency={concurrency}", "--toolsets=terminal",
                "--request_timeout=1.5", "--max_retries=8", "--max_attempts=100",
                f"--sandbox_root={workdir / 'sandboxes'}"]
        for k in range(kills + 20):
            resume = ["--resume"] if k else []
            proc = subprocess.Popen([*argv, *resume], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                    cwd=workdir, start_new_session=True)
            invocations += 1
            if k < kills:
                # mid-run, at a chosen point of progress (a time would be outrun by a fast machine)
                target = _settled(out / "soak") + rng.randint(prompts // (4 * kills + 4), prompts // (kills + 1))
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and proc.poll() is None and _settled(out / "soak") < target:
                    time.sleep(0.05)
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                codes.append("killed" if proc.returncode == -signal.SIGKILL else proc.returncode)
                continue
            _, err = proc.communicate(timeout=900)
            codes.append(proc.returncode)
            if proc.returncode == 0:
                break
            if proc.returncode not in (3,):
                raise RuntimeError(f"the runner exited {proc.returncode}:\n{err.decode(errors='replace')[-3000:]}")
        injected = dict(model.injected)
        served = model.served
    run_dir = out / "soak"
    merged = _ids(run_dir / "trajectories.jsonl")
    batches = [pid for p in sorted(run_dir.glob("batch_*.jsonl")) for pid in _ids(p)]
    stats = json.loads((run_dir / "statistics.json").read_text())
    checkpointed = set(ledger_ids(run_dir))
    counts = Counter(merged)
    return {
        "prompts": prompts,
        "requests_served": served,
        "faults_injected": sum(injected.values()),
        "faults_by_kind": injected,
        "kills": kills,
        "invocations": invocations,
        "exit_codes": codes,
        "trajectories": len(merged),
        "lost": prompts - len(set(merged)),
        "duplicated_in_trajectories": sum(c - 1 for c in counts.values() if c > 1),
        "duplicated_in_batch_files": len(batches) - len(set(batches)),
        "ledger_completed": len(checkpointed),
        "statistics_trajectories": stats["trajectories"],
        "statistics_api_calls": stats["api_calls"],
        "expected_api_calls": sum(2 if i % 5 == 0 else 1 for i in range(prompts)),
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=5000)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--chaos", type=float, default=0.05)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-soak-") as tmp:
        figures = soak(Path(tmp), prompts=args.prompts, kills=args.kills, chaos=args.chaos,
                       concurrency=args.concurrency, workers=args.workers, seed=args.seed)
    for key, value in figures.items():
        print(f"{key:<28} {value}")


if __name__ == "__main__":
    main()
