"""Every figure of the performance targets, in one run on this machine.

    python benchmarks/bench_performance.py [--resume_prompts=1000000] [--skip_docker]

1. The runner's CPU per trajectory: the difference between two runs of different sizes (start-up
   cancels), for one-call trajectories without tools, for two-call trajectories with one
   `terminal` call on the local backend (the prompt's bubblewrap jail, made at that call), and
   for six calls with five `terminal` calls (the cost of each further call and command); then a
   command alone, unjailed and jailed in each way (benchmarks/bench_jail.py): the floor under these. "runner" is the
   CPU of the runner's processes and what they waited for (rusage); "machine" is every core's
   busy time less the endpoint's (kernel work done elsewhere, such as namespace teardown, included).
2. Ratio to the ideal (prompts × calls × latency / loops) at 512 loops and 1 s latency, 1024 loops,
   and 200 ms latency; where the CPU bound sets in (cores / machine CPU per trajectory).
3. Memory: peak memory of the runner's processes with 1024 loops in flight, and per loop: their
   proportional set sizes summed (PSS: what they use together), and their RSS summed beside it.
4. Resume on a synthesized run of `resume_prompts` finished prompts (benchmarks/bench_resume.py).
5. Docker sandbox exec and start against the raw engine (benchmarks/bench_sandbox.py).
6. The same workload with this runner held to the reference's design, one agent loop per worker
   process (16 processes, as its README's example runs 15), against its 512 loops in 4 processes.
   A simulation with this runner's code, not the reference: benchmarks/bench_reference.py runs the
   real one.

The scripted endpoint (real HTTP on 127.0.0.1) shares the machine's cores with the runner.

Profiles (py-spy record --subprocesses, 2 workers, 128 loops, 0.05 s latency), what they showed
and what was done:
- one call, no tools, before (2.66 ms per trajectory): every prompt made and removed a sandbox it
  never used (LazySandbox._start 10.8%: Path.mkdir 6.7%, rmtree 2.6%); `chat.completions.create`
  walked every message to transform typed params (async_transform 6.4%); a group commit's fsyncs
  after every poll (RunStore.flush 4.4%); results off the pipe (Connection._recv 4.2%). Now a
  local sandbox is made when a tool asks, requests go through the SDK's `post`, commits are at
  most 0.1 s apart: 0.96 ms.
- two calls + terminal, before: a waitpid thread per command (ThreadedChildWatcher 8.8%), then
  Path.mkdir 4.0%, rmtree 4.2%, Popen 3.8%. Now (busy samples): the SDK's request path
  (AsyncAPIClient.post 24%), spawning the jail (create_subprocess_exec 9.3%, of it
  Popen._execute_child 5.7%), the prompt's directories (rmtree 9.1%, mkdir 6.5%), the final
  merge (6%). The jail itself (bwrap + setpriv + the shell, their processes and the kernel's
  namespace work) is about 6.5 ms of machine CPU here, measured alone; it was made for every
  command. Now it is made once per prompt and a shell in it forks each command: ~1.5 ms per
  command measured alone (0.36 ms of it the worker's: a request file, two FIFOs, their readers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_throughput  # noqa: E402

CORES = os.cpu_count() or 1


def run(prompts: int, loops: int, latency: float, workers: int = 4, no_tools: bool = False, commands: int = 1) -> dict:
    return bench_throughput.run(Namespace(prompts=prompts, concurrency=loops, workers=workers, latency=latency,
                                          no_tools=no_tools, commands=commands))


def per_trajectory(no_tools: bool, commands: int = 1) -> tuple[float, float]:
    """ms of runner CPU and of machine CPU per trajectory (two sizes; start-up and merge cancel)."""
    small, big = run(400, 128, 0.05, 2, no_tools, commands), run(2000, 128, 0.05, 2, no_tools, commands)
    n = big["prompts"] - small["prompts"]
    return ((big["runner_cpu_s"] - small["runner_cpu_s"]) / n * 1000,
            (big["runner_machine_cpu_s"] - small["runner_machine_cpu_s"]) / n * 1000)


def ratio_line(label: str, r: dict) -> str:
    return (f"  {label:<44} {r['wall_s']:6.1f} s vs ideal {r['ideal_s']:5.1f} s → {r['efficiency']:.2f}; "
            f"endpoint saw ≤{r['max_requests_in_flight']} at once; peak {r['peak_pss_mib']:.0f} MiB PSS")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resume_prompts", type=int, default=1_000_000, help="0 skips the resume figures")
    p.add_argument("--skip_docker", action="store_true")
    args = p.parse_args()
    print(f"machine: {CORES} cores, Python {sys.version.split()[0]}")

    print("\n1. runner CPU per trajectory (targets: ≤ 1 ms one call, ≤ 3 ms two calls + terminal)")
    one = per_trajectory(no_tools=True)
    two = per_trajectory(no_tools=False)
    six = per_trajectory(no_tools=False, commands=5)
    print(f"  one call, no tools:           runner {one[0]:.2f} ms, machine {one[1]:.2f} ms")
    print(f"  two calls + terminal (local): runner {two[0]:.2f} ms, machine {two[1]:.2f} ms")
    print(f"  six calls + 5 terminal calls: runner {six[0]:.2f} ms, machine {six[1]:.2f} ms → each further "
          f"call + command: runner {(six[0] - two[0]) / 4:.2f} ms, machine {(six[1] - two[1]) / 4:.2f} ms")
    print("  a command alone, one after another (benchmarks/bench_jail.py):")
    import bench_jail

    for label, ms in bench_jail.measure().items():
        print(f"    {label:<42} {ms:5.2f} ms of machine CPU")

    print("\n2. ratio to the ideal (target ≥ 0.90 at 512 loops, 1 s)")
    r512 = run(4096, 512, 1.0)
    print(ratio_line("512 loops, 1 s, two calls + terminal", r512))
    r512n = run(4096, 512, 1.0, no_tools=True)
    print(ratio_line("512 loops, 1 s, one call", r512n))
    r1024 = run(8192, 1024, 1.0, no_tools=True)
    print(ratio_line("1024 loops, 1 s, one call", r1024))
    r200 = run(4096, 512, 0.2)
    print(ratio_line("512 loops, 200 ms, two calls + terminal", r200))
    for label, ms, calls in (("two calls + terminal", two[1], 2), ("one call", one[1], 1)):
        rate = CORES / (ms / 1000)
        print(f"  CPU bound, {label}: {CORES} cores / {ms:.2f} ms = {rate:.0f} trajectories/s, reached at "
              f"{rate * calls * 1.0:.0f} loops with 1 s latency ({rate * calls * 0.2:.0f} with 200 ms)")

    print("\n3. memory (target < 1 GiB with 1,000 loops)")
    small = run(400, 16, 1.0, no_tools=True)
    per_loop = (r1024["peak_pss_mib"] - small["peak_pss_mib"]) * 1024 / (1024 - 16)
    print(f"  1024 loops: peak {r1024['peak_pss_mib']:.0f} MiB PSS, RSS summed {r1024['peak_rss_sum_mib']:.0f} MiB "
          f"(16 loops: {small['peak_pss_mib']:.0f} MiB PSS) "
          f"→ {per_loop:.0f} KiB per loop")

    if args.resume_prompts:
        print(f"\n4. resume on {args.resume_prompts:,} finished prompts (target: first new call < 5 s)")
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_resume.py"),
                              f"--finished={args.resume_prompts}", "--new=10"], capture_output=True, text=True)
        print("  " + (out.stdout.strip() or out.stderr[-2000:]).replace("\n", "\n  "))

    if not args.skip_docker and shutil.which("docker"):
        print("\n5. Docker sandbox against the raw engine (target ≤ 1.1×)")
        import bench_sandbox

        try:
            m = asyncio.run(bench_sandbox.measure("hermes-batch-sandbox:bookworm", 40))
            print(f"  warm exec: {m['exec']:.1f} ms vs raw {m['raw_exec']:.1f} ms → {m['exec'] / m['raw_exec']:.2f}×")
            print(f"  start:     {m['start']:.1f} ms vs raw create+start {m['raw_start']:.1f} ms → "
                  f"{m['start'] / m['raw_start']:.2f}×")
        except Exception as exc:  # no engine here: say so, the other figures stand
            print(f"  skipped: {type(exc).__name__}: {exc}")

    print("\n6. this runner held to the reference's design (one loop per worker process; simulated, not the real "
          "reference: see bench_reference.py) on the same 512 prompts, 0.5 s latency")
    ref = run(512, 16, 0.5, workers=16)
    ours = run(512, 512, 0.5, workers=4)
    print(ratio_line("one loop per process (simulated): 16 × 1", ref))
    print(ratio_line("hermes-batch: 4 processes × 128 loops", ours))
    print(f"  speed-up {ref['wall_s'] / ours['wall_s']:.1f}× (wall), CPU {ref['runner_machine_cpu_s']:.1f} s vs "
          f"{ours['runner_machine_cpu_s']:.1f} s, peak {ref['peak_pss_mib']:.0f} vs {ours['peak_pss_mib']:.0f} MiB PSS")


if __name__ == "__main__":
    main()
