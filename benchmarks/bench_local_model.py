"""The embedded model's figures on this machine: load time, prompt and generation tokens/s, and
seconds per trajectory, from a real `--model=local` run of the CLI.

    python benchmarks/bench_local_model.py --prompts=4 [--flags="--local_parallel=1 --concurrency=1"]

Load time is what the runner reports; tokens/s come from llama.cpp's own timings in the run's
`local_model.log`; seconds per trajectory from the records' `metadata.timings`.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fire

ROOT = Path(__file__).resolve().parent.parent
TIMING = re.compile(r"^\s*(prompt eval|eval) time =\s*([\d.]+) ms /\s*(\d+) tokens", re.M)


def main(prompts: int = 4, dataset: str = str(ROOT / "data" / "example_prompts.jsonl"), flags: str = "") -> None:
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--run_name=bench",
                f"--output_dir={out}", "--model=local", f"--max_samples={prompts}", *shlex.split(flags)]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True)
        wall = time.monotonic() - started
        if proc.returncode not in (0, 3):
            sys.exit(f"the run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        run = Path(out) / "bench"
        load = re.search(r"local model ready in ([\d.]+) s", proc.stderr)
        ms = {"prompt eval": 0.0, "eval": 0.0}
        tokens = {"prompt eval": 0, "eval": 0}
        for kind, spent, n in TIMING.findall((run / "local_model.log").read_text(errors="replace")):
            ms[kind] += float(spent)
            tokens[kind] += int(n)
        records = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines() if line]
        seconds = [r["metadata"]["timings"]["total_seconds"] for r in records]
        tool_calls = sum(1 for r in records for t in r["conversations"] if t["from"] == "tool")
        with_tools = sum(any(t["from"] == "tool" for t in r["conversations"]) for r in records)
    print(f"command: {shlex.join(argv[1:])}")
    print(f"model load:          {load.group(1) if load else '?'} s")
    print(f"prompt processing:   {tokens['prompt eval'] / max(ms['prompt eval'] / 1000, 1e-9):.1f} tok/s "
          f"({tokens['prompt eval']} tokens not in a slot's cache)")
    print(f"generation:          {tokens['eval'] / max(ms['eval'] / 1000, 1e-9):.1f} tok/s per request "
          f"({tokens['eval']} tokens)")
    if seconds:
        print(f"seconds/trajectory:  median {statistics.median(seconds):.0f}, min {min(seconds):.0f}, "
              f"max {max(seconds):.0f} ({len(records)} kept, {with_tools} with tool calls, {tool_calls} calls in all, "
              f"{sum(r['completed'] for r in records)} with a final answer)")
    print(f"wall time:           {wall:.0f} s for {prompts} prompts, start-up included")


if __name__ == "__main__":
    fire.Fire(main)
