"""What `--resume` costs on a big finished run: time to the first new model call, and in all.

    python benchmarks/bench_resume.py [--finished=100000] [--new=10]

Synthesizes a run of `finished` settled prompts (records shaped like the runner's, about 2.7 KB
each, in batch files of 10 as the runner writes them) plus `new` rows not run yet, then runs
`--resume` against the scripted endpoint and prints when its first request arrived and when the
run ended; then a second `--resume` with nothing left to do. The target (issue: performance) is
a first request within 5 s at 1,000,000 finished prompts, and a cost that grows with the new work.
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

from hermes_batch.dataset import load_dataset  # noqa: E402
from tests.scripted_model import ScriptedModel  # noqa: E402


def synthesize(work: Path, finished: int, new: int) -> Path:
    data = work / "d.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for i in range(finished + new):
            f.write(json.dumps({"prompt": f"synthetic prompt {i}"}) + "\n")
    run = work / "out" / "big"
    run.mkdir(parents=True)
    handles: dict[int, object] = {}
    for rec in load_dataset(data).records[:finished]:
        batch = rec.index // 10
        if batch not in handles:
            for h in handles.values():
                h.close()  # type: ignore[attr-defined]
            handles = {batch: open(run / f"batch_{batch}.jsonl", "a", encoding="utf-8")}
        record = {
            "id": rec.id, "prompt_index": rec.index,
            "conversations": [
                {"from": "system", "value": "S" * 1500, "tool_calls": None, "name": None, "tool_call_id": None,
                 "reasoning_details": None},
                {"from": "human", "value": rec.prompt, "tool_calls": None, "name": None, "tool_call_id": None,
                 "reasoning_details": None},
                {"from": "gpt", "value": "<think>\nx\n</think>\nok", "tool_calls": None, "name": None,
                 "tool_call_id": None, "reasoning_details": None}],
            "metadata": {"batch_num": batch, "timestamp": "2026-11-30T00:00:00+00:00", "model": "scripted",
                         "stop_reason": "final_answer", "tools_offered": ["terminal"], "unknown_tool_calls": 0,
                         "reasoning_turns": 1, "assistant_turns": 1,
                         "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110, "cost": None},
                         "llm_calls": [], "llm_seconds": 0.1, "tool_seconds": 0.0, "dataset": None,
                         "config_fingerprint": "synthetic", "backend": "local", "distribution": None,
                         "run_name": "big", "image": None, "attempt": 1, "timings": {}},
            "completed": True, "partial": False, "api_calls": 1, "toolsets_used": ["terminal"], "tool_stats": {},
            "tool_error_counts": {}}
        handles[batch].write(json.dumps(record, separators=(",", ":")) + "\n")  # type: ignore[attr-defined]
    for h in handles.values():
        h.close()  # type: ignore[attr-defined]
    return data


def resume(work: Path, data: Path, model: ScriptedModel) -> tuple[float | None, float]:
    before = len(model.requests)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={data}", "--run_name=big",
         f"--output_dir={work / 'out'}", f"--base_url={model.base_url}", "--model=scripted", "--api_key=x", "--resume",
         "--allow_config_change", "--toolsets=terminal", "--num_workers=1", "--concurrency=4",
         f"--sandbox_root={work / 'sb'}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and len(model.requests) > before:
            first = time.monotonic() - started
        time.sleep(0.01)
    if proc.returncode != 0:
        raise SystemExit(f"resume failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
    return first, time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--finished", type=int, default=100_000)
    p.add_argument("--new", type=int, default=10)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hb-resume-"))
    try:
        t0 = time.monotonic()
        data = synthesize(work, args.finished, args.new)
        size = sum(f.stat().st_size for f in (work / "out" / "big").iterdir())
        print(f"synthesized {args.finished} finished prompts ({size / 2**20:.0f} MiB of batch files) "
              f"+ {args.new} new rows in {time.monotonic() - t0:.1f} s")
        with ScriptedModel() as model:
            first, total = resume(work, data, model)
            print(f"--resume with {args.new} new: first model request after {first:.2f} s, done after {total:.2f} s")
            _, idle = resume(work, data, model)
            print(f"--resume with nothing to do: done after {idle:.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
