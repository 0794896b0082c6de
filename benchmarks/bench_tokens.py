"""--tokens=exact in figures, side by side in one run:

1. The runner's CPU per model call, token-exact against chat: the same scripted trajectories (each
   call answered by a tool the run does not offer, so no sandbox work is counted) run once through a
   chat endpoint (tests/scripted_model.py) and once through llama.cpp's native endpoints
   (tests/llamacpp_double.py). Goal: exact ≤ 1.5× chat.
2. Bytes of token data stored per 1,000 tokens, with and without log-probabilities, on real ids and
   log-probabilities: the embedded model's vocabulary tokenising this repository's docs, and its own
   samples for the log-probabilities (needs `.[local]`; skipped without it). Goals: ≤ 3 KB, ≤ 8 KB.

    python benchmarks/bench_tokens.py [--prompts=40] [--turns=8]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import fire

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_batch.tokens import pack_ids, pack_logprobs  # noqa: E402
from tests.llamacpp_double import LlamaCppDouble  # noqa: E402
from tests.scripted_model import ScriptedModel, script  # noqa: E402


def runner_cpu(base_url: str, model: str, rows: list[dict], out: Path, extra: list[str]) -> tuple[float, int]:
    """CPU seconds of the runner (all its processes) and the model calls it made."""
    data = out / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={data}", "--run_name=b",
                           f"--output_dir={out}", f"--model={model}", f"--base_url={base_url}", "--api_key=k",
                           "--toolsets=terminal", "--require_reasoning=False", "--max_turns=50", "--num_workers=1",
                           "--concurrency=8", *extra], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"the run failed:\n{proc.stderr[-3000:]}")
    calls = sum(json.loads(line)["api_calls"] for line in (out / "b" / "trajectories.jsonl").read_text().splitlines())
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), calls


def cpu_figures(prompts: int, turns: int) -> None:
    steps = [{"calls": [["no_such_tool", {"n": i, "pad": "x" * 200}]]} for i in range(turns - 1)] + [{"answer": "done"}]
    rows = [{"prompt": script(*steps, text=f"Task {i}: " + "context " * 100)} for i in range(prompts)]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with ScriptedModel(record_requests=False) as chat:
            chat_cpu, chat_calls = runner_cpu(chat.base_url, "scripted", rows, Path(a), [])
        with LlamaCppDouble() as native:
            exact_cpu, exact_calls = runner_cpu(native.base_url, "double", rows, Path(b), ["--tokens=exact"])
    per_chat, per_exact = chat_cpu / chat_calls, exact_cpu / exact_calls
    print(f"runner CPU per model call ({prompts} trajectories of {turns} calls, start-up included):")
    print(f"  chat          {1000 * per_chat:7.2f} ms  ({chat_calls} calls, {chat_cpu:.1f} s)")
    print(f"  token-exact   {1000 * per_exact:7.2f} ms  ({exact_calls} calls, {exact_cpu:.1f} s)")
    print(f"  ratio         {per_exact / per_chat:7.2f}×  (goal ≤ 1.5×)")


def byte_figures(samples: int) -> None:
    try:
        from hermes_batch.llm.local_model import LocalModelError, LocalModelServer, resolve_model_file

        model = resolve_model_file(None, progress=False)
    except (ImportError, LocalModelError) as exc:
        print(f"bytes per 1,000 tokens: skipped, no embedded model ({exc})")
        return
    import urllib.request

    def post(url: str, body: dict) -> dict:
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.load(resp)

    text = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    with tempfile.TemporaryDirectory() as tmp, LocalModelServer(model, threads=2, ctx=4096, parallel=1,
                                                                log_path=Path(tmp) / "log") as server:
        base = server.url.removesuffix("/v1")
        ids = post(f"{base}/tokenize", {"content": text})["tokens"]
        logprobs: list[float] = []
        for i in range(samples):
            answer = post(f"{base}/completion", {"prompt": f"Explain topic {i} of Python in detail.", "n_predict": 200,
                                                 "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                                 "n_probs": 1, "post_sampling_probs": False, "seed": i})
            logprobs += [p["logprob"] for p in answer["completion_probabilities"]]
    chunk = 1000
    id_bytes = [len(pack_ids(ids[i:i + chunk])) for i in range(0, len(ids) - chunk, chunk)]
    lp = (logprobs * (len(ids) // max(1, len(logprobs)) + 1))[:len(ids)]
    lp_bytes = [len(pack_logprobs(lp[i:i + chunk])) for i in range(0, len(lp) - chunk, chunk)]
    ids_kb = sum(id_bytes) / len(id_bytes) / 1024
    both_kb = ids_kb + sum(lp_bytes) / len(lp_bytes) / 1024
    print(f"bytes of token data per 1,000 tokens ({len(ids)} ids of this repository's docs, {len(logprobs)} "
          f"log-probabilities of the embedded model's own samples):")
    print(f"  ids only            {ids_kb:5.2f} KB  (goal ≤ 3 KB)")
    print(f"  ids + logprobs      {both_kb:5.2f} KB  (goal ≤ 8 KB)")
    print(f"  as plain JSON lists {len(json.dumps(ids[:chunk])) / 1024 + len(json.dumps(lp[:chunk])) / 1024:5.2f} KB")


def main(prompts: int = 40, turns: int = 8, samples: int = 6) -> None:
    cpu_figures(prompts, turns)
    byte_figures(samples)


if __name__ == "__main__":
    fire.Fire(main)
