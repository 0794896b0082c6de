"""Throughput and memory of the runner against a model endpoint with a fixed latency.

    python benchmarks/bench_throughput.py [--prompts=2000] [--concurrency=256] [--workers=4] [--latency=0.5]

The scripted endpoint (tests/scripted_model.py, real HTTP on 127.0.0.1) answers every request
after `latency` seconds. Each prompt makes two model calls with one `terminal` call in between
(local backend), `--commands=N` calls with N in between, or with --no_tools one call and no
sandbox work. With `concurrency` loops in
flight the ideal wall time is prompts × calls × latency / concurrency; the script prints the
measured time against that ideal, how many requests the endpoint saw at once (saturation), and
the memory the runner's processes used per agent loop.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.scripted_model import ScriptedModel, script  # noqa: E402


def sample_tree(root_pid: int, cpu: dict[int, float]) -> tuple[int, int]:
    """Memory (bytes) of a process and all its descendants: proportional set size (a page shared by
    n processes counts 1/n to each: forked workers and many jails are not counted over and over)
    and resident set sizes summed (every shared page once per process). Records each one's CPU
    seconds so far in `cpu` (pid → seconds, children it waited for included, except the fork
    server's: its children are the workers, counted themselves)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stats[int(entry)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry))
    tick = os.sysconf("SC_CLK_TCK")
    pss, rss, stack = 0, 0, [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        fields = stats.get(pid)
        if fields is None:
            continue
        waited = 0 if pid in children.get(root_pid, []) and _is_fork_server(pid) else int(fields[13]) + int(fields[14])
        cpu[pid] = max(cpu.get(pid, 0.0), (int(fields[11]) + int(fields[12]) + waited) / tick)
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:3]:
                kind, kib = line.split()[:2]
                if kind == "Rss:":
                    rss += int(kib) * 1024
                elif kind == "Pss:":
                    pss += int(kib) * 1024
        except (OSError, ValueError):
            pass
    return pss, rss


def _is_fork_server(pid: int) -> bool:
    try:
        return b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def machine_busy_seconds() -> float:
    """CPU seconds this machine has been busy (every core, kernel work included), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def run(args) -> dict:
    model = ScriptedModel(latency=args.latency, record_requests=False)
    model.start()
    work = Path(tempfile.mkdtemp(prefix="hb-bench-"))
    commands = 0 if args.no_tools else args.commands
    steps = [{"calls": [["terminal", {"command": f"echo step-{k}"}]]} for k in range(commands)]
    rows = [{"prompt": script(*steps, {"answer": "ok"}, text=f"p{i}")} for i in range(args.prompts)]
    data = work / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={data}", "--run_name=bench",
           f"--output_dir={work / 'out'}", f"--base_url={model.base_url}", "--model=scripted", "--api_key=x",
           f"--num_workers={args.workers}", f"--concurrency={args.concurrency}", "--batch_size=100",
           f"--sandbox_root={work / 'sb'}", "--toolsets=terminal"]
    peak = peak_rss = 0
    children0, self0, busy0 = (cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)),
                               cpu_seconds(resource.getrusage(resource.RUSAGE_SELF)), machine_busy_seconds())
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    tree_cpu: dict[int, float] = {}

    def sample():
        nonlocal peak, peak_rss
        pause = 0.05
        while not stop.wait(pause):
            began = time.monotonic()
            pss, rss = sample_tree(proc.pid, tree_cpu)
            peak, peak_rss = max(peak, pss), max(peak_rss, rss)
            # the sampler shares the cores (and the endpoint's interpreter) with what it measures:
            # with many live processes (a jail per prompt in flight) it samples less often
            pause = max(0.05, 20 * (time.monotonic() - began))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - started
    stop.set()
    sampler.join()
    # the runner's processes (sampled: the workers are not its children, but the fork server's) and
    # what they waited for (jails, commands); the endpoint is a thread of this process, so the
    # machine's busy time less this process's is the runner's share, kernel work elsewhere included
    runner_cpu = sum(tree_cpu.values()) + cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)) - children0 \
        - tree_cpu.get(proc.pid, 0.0)  # the runner itself is counted by rusage, which saw its end
    machine_cpu = machine_busy_seconds() - busy0 - (cpu_seconds(resource.getrusage(resource.RUSAGE_SELF)) - self0)
    model.stop()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {err[-2000:]}")
    calls = commands + 1
    ideal = args.prompts * calls * args.latency / args.concurrency
    stats = json.loads((work / "out" / "bench" / "statistics.json").read_text())
    shutil.rmtree(work, ignore_errors=True)
    # idle footprint: the same runner with one loop per worker, to separate per-loop cost
    return {
        "prompts": args.prompts, "concurrency": args.concurrency, "workers": args.workers,
        "latency_s": args.latency, "model_calls": model.served, "trajectories": stats["trajectories"],
        "wall_s": round(wall, 2), "ideal_s": round(ideal, 2), "efficiency": round(ideal / wall, 3),
        "max_requests_in_flight": model.max_in_flight,
        "saturation": round(model.max_in_flight / args.concurrency, 3),
        "requests_per_s": round(model.served / wall, 1),
        "peak_pss_mib": round(peak / 2**20, 1), "peak_rss_sum_mib": round(peak_rss / 2**20, 1),
        "runner_cpu_s": round(runner_cpu, 2), "runner_machine_cpu_s": round(machine_cpu, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.5)
    p.add_argument("--no_tools", action="store_true")
    p.add_argument("--commands", type=int, default=1, help="terminal calls per prompt, each followed by a model call")
    p.add_argument("--small_concurrency", type=int, default=8,
                   help="a second run at this concurrency gives the memory cost per extra loop")
    args = p.parse_args()
    big = run(args)
    small_args = argparse.Namespace(**{**vars(args), "concurrency": args.small_concurrency,
                                       "prompts": max(args.small_concurrency * 20, 100)})
    small = run(small_args)
    per_loop_kib = (big["peak_pss_mib"] - small["peak_pss_mib"]) * 1024 / (args.concurrency - args.small_concurrency)
    # start-up and the final merge cost the same in both runs; the small run measures them
    fixed = max(0.0, small["wall_s"] - small["ideal_s"])
    steady = big["ideal_s"] / max(1e-6, big["wall_s"] - fixed)
    print(json.dumps({"run": big, "reference_small_run": small}, indent=2))
    print(f"\n{big['prompts']} prompts, {big['concurrency']} loops in flight over {big['workers']} workers, "
          f"endpoint latency {big['latency_s']} s")
    print(f"wall {big['wall_s']} s vs ideal {big['ideal_s']} s  → efficiency {big['efficiency']:.0%}; "
          f"without the fixed {fixed:.1f} s of start-up and merge (measured by the small run) {steady:.0%}")
    print(f"endpoint saw up to {big['max_requests_in_flight']} requests at once "
          f"(saturation {big['saturation']:.0%} of the loop limit); {big['requests_per_s']} requests/s")
    print(f"peak memory {big['peak_pss_mib']} MiB PSS (vs {small['peak_pss_mib']} MiB at {args.small_concurrency} loops) "
          f"→ about {per_loop_kib:.0f} KiB per extra agent loop")


if __name__ == "__main__":
    main()
