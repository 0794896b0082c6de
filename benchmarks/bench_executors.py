"""The same workload with the local executor and with Ray on a two-node cluster on this host, side by side.

    python benchmarks/bench_executors.py [--prompts=2000] [--concurrency=128] [--workers=4] [--latency=0.5]

A Ray cluster of two nodes is started here (`ray start`, as tests/ray_cluster.py does) and ended
by pid afterwards. Each prompt makes two model calls with one `terminal` call between them (local
backend) against the scripted endpoint (tests/scripted_model.py), which answers after `latency`
seconds. The ideal wall time is prompts × 2 × latency / concurrency; both runs print it, their
efficiency against it, and Ray's time against the local executor's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ray_cluster import RayCluster  # noqa: E402
from tests.scripted_model import ScriptedModel  # noqa: E402


def one_run(executor: str, work: Path, model: ScriptedModel, data: Path, args, cluster: RayCluster) -> dict:
    out = work / f"out-{executor}"
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={data}", "--run_name=bench",
           f"--output_dir={out}", f"--base_url={model.base_url}", "--model=scripted", "--api_key=x",
           f"--num_workers={args.workers}", f"--concurrency={args.concurrency}", "--batch_size=100",
           f"--sandbox_root={work / ('sb-' + executor)}", "--toolsets=terminal", f"--executor={executor}"]
    if executor == "ray":
        cmd.append(f"--ray_address={cluster.address}")
    served_before = model.served
    started = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env)
    wall = time.monotonic() - started
    if res.returncode != 0:
        raise SystemExit(f"{executor} run failed ({res.returncode}): {res.stderr[-3000:]}")
    stats = json.loads((out / "bench" / "statistics.json").read_text())
    ideal = args.prompts * 2 * args.latency / args.concurrency
    nodes = [line for line in res.stderr.splitlines() if line.startswith("Ray: prompts settled per node")]
    return {"executor": executor, "trajectories": stats["trajectories"], "model_calls": model.served - served_before,
            "wall_s": round(wall, 2), "ideal_s": round(ideal, 2), "efficiency": round(ideal / wall, 3),
            "per_node": nodes[0].split("per node: ", 1)[1] if nodes else "this machine"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.5)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hb-exec-"))
    data = work / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"benchmark prompt {i}"}) + "\n" for i in range(args.prompts)))
    cluster = RayCluster(Path(tempfile.mkdtemp(prefix="hbray-", dir="/tmp")))
    try:
        t0 = time.monotonic()
        cluster.start(nodes=2)
        start_s = time.monotonic() - t0
        with ScriptedModel(latency=args.latency, record_requests=False) as model:
            results = [one_run(e, work, model, data, args, cluster) for e in ("local", "ray")]
    finally:
        left = cluster.stop()
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))
    local, ray = results
    print(f"\n{args.prompts} prompts × 2 model calls + 1 terminal call, {args.concurrency} loops in flight, "
          f"{args.workers} workers/actors, endpoint latency {args.latency} s; ideal {local['ideal_s']} s")
    for r in results:
        print(f"  {r['executor']:<6} wall {r['wall_s']:>6} s  efficiency {r['efficiency']:.0%}  ({r['per_node']})")
    print(f"  ray / local wall time: {ray['wall_s'] / local['wall_s']:.2f}×  "
          f"(cluster start, not counted: {start_s:.1f} s; Ray processes left afterwards: {len(left)})")


if __name__ == "__main__":
    main()
