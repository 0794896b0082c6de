"""How fast export cleans: decontamination against a 10,000-item benchmark and near-duplicate
removal, over a synthetic run of 100,000 trajectories (about 5 kB of text each: a prompt, two tool
results, an answer), through the real CLI.

    python benchmarks/bench_clean.py [--rows=100000] [--items=10000]

Planted: 1% exact copies, 2% near copies (one word of the answer changed), 0.5% rows whose tool
result quotes 20 words of a benchmark item. It prints the time of a plain export to Parquet, of the
same with each step and with both, the steps' own rows per second (the plain export's time taken
off), the benchmark index's build and its read from the cache, and each export's peak memory. The
machine's two cores are shared: run it when nothing else does."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(rng.choices(vocab, k=n))


def turn(kind: str, text: str, **extra: object) -> dict:
    return {"from": kind, "value": text, "content": text, "reasoning": None, "tool_calls": None, "name": None,
            "tool_call_id": None, "reasoning_details": None, **extra}


def make_run(run_dir: Path, rows: int, items: list[str], rng: random.Random, vocab: list[str]) -> dict:
    run_dir.mkdir(parents=True)
    planted = {"exact": 0, "near": 0, "contaminated": 0}
    last: dict | None = None
    with open(run_dir / "trajectories.jsonl", "w") as f:
        for i in range(rows):
            roll = rng.random()
            if last is not None and roll < 0.01:
                rec = {**last, "id": f"r{i}", "prompt_index": i}
                planted["exact"] += 1
            elif last is not None and roll < 0.03:
                answer = last["conversations"][-1]["content"].split(" ")
                answer[rng.randrange(len(answer))] = "changed"
                convo = [*last["conversations"][:-1], turn("gpt", " ".join(answer))]
                rec = {**last, "id": f"r{i}", "prompt_index": i, "conversations": convo}
                planted["near"] += 1
            else:
                result = words(rng, vocab, 300)
                if roll > 0.995:
                    quoted = rng.choice(items).split(" ")
                    at = rng.randrange(max(1, len(quoted) - 20))
                    result += " " + " ".join(quoted[at:at + 20])
                    planted["contaminated"] += 1
                call = {"id": "c1", "name": "terminal", "arguments": json.dumps({"command": f"cat file{i}.txt"})}
                rec = {"id": f"r{i}", "prompt_index": i, "prompt_id": f"r{i}", "conversations": [
                    turn("system", "You are a helpful agent."),
                    turn("human", words(rng, vocab, 60)),
                    turn("gpt", words(rng, vocab, 30), tool_calls=[call]),
                    turn("tool", result, name="terminal", tool_call_id="c1"),
                    turn("gpt", words(rng, vocab, 30), tool_calls=[{**call, "id": "c2"}]),
                    turn("tool", words(rng, vocab, 300), name="terminal", tool_call_id="c2"),
                    turn("gpt", words(rng, vocab, 80))],
                    "metadata": {"assistant_turns": 3, "usage": {"total_tokens": 1500}, "model": "bench",
                                 "run_name": "bench"},
                    "completed": True, "partial": False, "api_calls": 3, "toolsets_used": ["terminal"],
                    "tool_stats": {}, "tool_error_counts": {}, "verification": {"status": "pass", "score": 1.0}}
                last = rec
            f.write(json.dumps(rec) + "\n")
    return planted


def export(out: Path, env: dict, *flags: str) -> tuple[float, str, int]:
    """Seconds, what it said, its peak memory (KiB)."""
    code = ("import resource, sys, runpy; sys.argv = ['batch_runner.py', 'export', *sys.argv[1:]]\n"
            "try:\n    runpy.run_path('batch_runner.py', run_name='__main__')\n"
            "finally:\n    print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code, "--run_name=bench", f"--output_dir={out}",
                          f"--output={out / 'rows.parquet'}", *flags], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    took = time.monotonic() - start
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    peak = int(res.stderr.rsplit("PEAK", 1)[1].split()[0])
    return took, res.stderr.rsplit("PEAK", 1)[0], peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--items", type=int, default=10_000)
    args = ap.parse_args()
    rng = random.Random(7)
    vocab = [f"w{n:x}{rng.choice('aeiou')}" for n in range(20_000)]
    with tempfile.TemporaryDirectory(prefix="hermes-bench-clean-") as tmp:
        out = Path(tmp)
        items = [words(rng, vocab, 120) for _ in range(args.items)]
        bench = out / "bench.jsonl"
        with open(bench, "w") as f:
            for k, text in enumerate(items):
                f.write(json.dumps({"task_id": f"B/{k}", "prompt": text[:len(text) // 2],
                                    "canonical_solution": text[len(text) // 2:]}) + "\n")
        t = time.monotonic()
        planted = make_run(out / "bench", args.rows, items, rng, vocab)
        size = (out / "bench" / "trajectories.jsonl").stat().st_size
        print(f"{args.rows:,} rows ({size / 2**20:.0f} MiB), a benchmark of {args.items:,} items; planted: {planted} "
              f"(made in {time.monotonic() - t:.0f} s)")
        env = {**os.environ, "HERMES_BATCH_CACHE": str(out / "cache"), "PYTHONPATH": str(ROOT)}
        os.environ["HERMES_BATCH_CACHE"] = env["HERMES_BATCH_CACHE"]
        sys.path.insert(0, str(ROOT))
        from hermes_batch.export.clean.contamination import BenchmarkIndex

        t = time.monotonic()
        index = BenchmarkIndex.of(str(bench), 13)
        built = time.monotonic() - t
        t = time.monotonic()
        BenchmarkIndex.of(str(bench), 13)
        print(f"the benchmark's index: {len(index.hashes):,} 13-grams, built in {built:.1f} s, read from the cache in "
              f"{time.monotonic() - t:.2f} s")
        base, _, base_peak = export(out, env)
        print(f"plain export to Parquet: {base:.1f} s, peak {base_peak / 1024:.0f} MiB")
        warm, said, peak = export(out, env, f"--decontaminate={bench}")
        print(f"--decontaminate: {warm:.1f} s ({args.rows / max(warm - base, 1e-9):,.0f} rows/s for the step), "
              f"peak {peak / 1024:.0f} MiB")
        print("  " + next(line for line in said.splitlines() if line.startswith("contamination")))
        near, said, peak = export(out, env, "--dedup=near")
        print(f"--dedup=near: {near:.1f} s ({args.rows / max(near - base, 1e-9):,.0f} rows/s for the step), "
              f"peak {peak / 1024:.0f} MiB")
        print("  " + next(line for line in said.splitlines() if line.startswith("duplicates")))
        both, said, peak = export(out, env, "--dedup=near", f"--decontaminate={bench}")
        print(f"both: {both:.1f} s for {args.rows:,} rows ({args.rows / both:,.0f} rows/s end to end), "
              f"peak {peak / 1024:.0f} MiB")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
