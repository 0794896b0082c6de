"""What `--resume` costs on a big finished run: time to the first new model call, and in all.

    python benchmarks/bench_resume.py [--finished=100000] [--new=10]

Synthesizes a run of `finished` settled prompts, written by the runner's own store (records shaped
like the runner's, about 2.4 KB each, in batch files of 10, and the ledger), resumes it once (which
indexes the dataset and merges), appends `new` rows to the dataset and runs `--resume` against the
scripted endpoint: it prints when its first request arrived, when the run ended and whether
trajectories.jsonl was appended to; then a `--resume` with nothing left to do. The target (issue: performance) is
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

from hermes_batch.dataset.rows import load_dataset  # noqa: E402
from hermes_batch.record.outcome import Outcome, dumps  # noqa: E402
from hermes_batch.store.run_store import RunStore  # noqa: E402
from tests.scripted_model import ScriptedModel  # noqa: E402


def synthesize(work: Path, finished: int) -> Path:
    """A finished run of `finished` prompts, written by the runner's own store (records + ledger)."""
    data = work / "d.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for i in range(finished):
            f.write(json.dumps({"prompt": f"synthetic prompt {i}"}) + "\n")
    run = work / "out" / "big"
    run.mkdir(parents=True)
    store = RunStore(run)
    template = dumps(_record("ID", -1, "PROMPT", -2)).decode()
    for index, pid in enumerate(load_dataset(data).ids):
        line = (template.replace('"ID"', json.dumps(pid)).replace('"PROMPT"', json.dumps(f"synthetic prompt {index}"))
                .replace(":-1,", f":{index},", 1).replace(":-2,", f":{index // 10},", 1))
        store.record(Outcome("done", pid, index, line.encode(), tokens=110), index // 10)
        if index % 10_000 == 0:
            store.flush()
    store.close()
    return data


def _record(pid: str, index: int, prompt: str, batch: int) -> dict:
    turn = {"tool_calls": None, "name": None, "tool_call_id": None, "reasoning_details": None}
    return {
        "id": pid, "prompt_index": index,
        "conversations": [{"from": "system", "value": "S" * 1500, **turn}, {"from": "human", "value": prompt, **turn},
                          {"from": "gpt", "value": "<think>\nx\n</think>\nok", **turn}],
        "metadata": {"batch_num": batch, "timestamp": "2026-11-30T00:00:00+00:00", "model": "scripted",
                     "stop_reason": "final_answer", "tools_offered": ["terminal"], "unknown_tool_calls": 0,
                     "reasoning_turns": 1, "assistant_turns": 1,
                     "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110, "cost": None},
                     "llm_calls": [], "llm_seconds": 0.1, "tool_seconds": 0.0, "dataset": None,
                     "config_fingerprint": "synthetic", "backend": "local", "distribution": None,
                     "run_name": "big", "image": None, "attempt": 1, "timings": {}},
        "completed": True, "partial": False, "api_calls": 1, "toolsets_used": ["terminal"], "tool_stats": {},
        "tool_error_counts": {}}


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
    p.add_argument("--keep", metavar="DIR", help="synthesize into DIR and keep it (to profile the runner on it)")
    args = p.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hb-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.monotonic()
        data = synthesize(work, args.finished)
        run = work / "out" / "big"
        size = sum(f.stat().st_size for f in run.iterdir())
        print(f"synthesized {args.finished:,} finished prompts ({size / 2**20:,.0f} MiB of batch files, "
              f"{len(list(run.glob('batch_*.jsonl'))):,} files) in {time.monotonic() - t0:.1f} s")
        with ScriptedModel() as model:
            _, setup = resume(work, data, model)
            print(f"first --resume (indexes the dataset, merges every record once): {setup:.2f} s")
            with open(data, "a", encoding="utf-8") as f:
                for i in range(args.new):
                    f.write(json.dumps({"prompt": f"new prompt {i}"}) + "\n")
            merged = run / "trajectories.jsonl"
            before = (merged.stat().st_ino, merged.stat().st_size)
            first, total = resume(work, data, model)
            print(f"--resume with {args.new} new rows appended to the dataset: first model request after {first:.2f} s, "
                  f"done after {total:.2f} s")
            after = (merged.stat().st_ino, merged.stat().st_size)
            print(f"  trajectories.jsonl {'appended to' if after[0] == before[0] else 'REWRITTEN'}: "
                  f"+{after[1] - before[1]:,} bytes")
            _, idle = resume(work, data, model)
            print(f"--resume with nothing to do: done after {idle:.2f} s")
            checkpoint = (run / "checkpoint.json").stat().st_size
            print(f"checkpoint.json: {checkpoint:,} bytes (rewritten every 2 s while a run goes)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
