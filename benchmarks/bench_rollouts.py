"""Rollouts for a trainer (hermes_batch/rollout) in figures, side by side in one run:

1. Rollouts per second and the runner's overhead per rollout: the same work (P prompts × G samples,
   each two terminal calls and an answer, against llama.cpp's native endpoints as
   tests/llamacpp_double.py serves them, token-exact) run as one batch run, and as the steps of a
   trainer (S steps of P/S groups each, every step a run of its own, as `rollout_func` runs them).
   The ideal ratio is 1.0; what a step pays beyond it is its start (workers, backend, merge).
   Then the same steps asked of the rollout service (`serve`, over HTTP on loopback, its workers
   warm across steps).
2. A trainer's idle share and its rollouts' staleness against the service, with a stand-in
   optimizer step of `--train_seconds`: synchronous (each step's rollouts asked, waited for, then
   trained on) and one step ahead (the next step's rollouts asked before training on this one's,
   as an asynchronous trainer does: staleness 1, less idle).
3. Weight sync: writing a policy's weights as GGUF (write_gguf), the embedded llama.cpp server
   loading them, and a running one swapped to them (the rollout service's reload), for the tests' tiny policy and for a Qwen2 of 0.1 B parameters with the
   embedded model's vocabulary (needs `.[rl,local]`; skipped without it).

    python benchmarks/bench_rollouts.py [--prompts=16] [--samples=4] [--steps=4] 2>/dev/null

(the runs say what they do on stderr; the figures are on stdout)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import fire

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_batch.config import configure  # noqa: E402
from hermes_batch.rollout import (  # noqa: E402
    RolloutRequest,
    Rollouts,
    RolloutService,
    ServiceClient,
    ServiceServer,
    wait_for,
)
from hermes_batch.runner import run  # noqa: E402
from tests.llamacpp_double import LlamaCppDouble  # noqa: E402
from tests.test_tokens import echoes  # noqa: E402

FLAGS = {"model": "double", "api_key": "k", "tokens": "exact", "toolsets": ["terminal"], "require_reasoning": False,
         "num_workers": 2, "concurrency": 16}


def batch(base_url: str, rows: list[dict], samples: int, out: Path) -> float:
    data = out / "batch.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.perf_counter()
    run(configure({**FLAGS, "base_url": base_url, "dataset_file": str(data), "run_name": "batch",
                   "output_dir": str(out), "samples": samples, "sandbox_root": str(out / "sb")}))
    return time.perf_counter() - t0


def stepped(base_url: str, rows: list[dict], samples: int, steps: int, out: Path) -> float:
    data = out / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = Rollouts(data, run_name="rl", output_dir=out, base_url=base_url, sandbox_root=str(out / "sb"), **FLAGS)
    prompts = engine.prompts
    per = -(-len(prompts) // steps)
    t0 = time.perf_counter()
    for step in range(steps):
        engine.run([p for p in prompts[step * per:(step + 1) * per] for _ in range(samples)], step)
    return time.perf_counter() - t0


def served(base_url: str, rows: list[dict], samples: int, steps: int, out: Path,
           train_seconds: float) -> tuple[float, list[tuple[str, float, float, Counter]]]:
    """The steps asked of one long-lived service: (seconds for the plain steps, then per trainer
    mode: its name, seconds, idle share, staleness counts)."""
    data = out / "served.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = [r["prompt"] for r in rows]
    per = -(-len(prompts) // steps)
    service = RolloutService(data, run_name="served", output_dir=out, base_url=base_url, sandbox_root=str(out / "sb"),
                             **FLAGS)
    with service:
        server = ServiceServer(service).start()
        client = ServiceClient(server.url, token=server.token)
        asked = 0

        def ask(step: int, version: int) -> list[str]:
            nonlocal asked
            ids = []
            for prompt in prompts[step * per:(step + 1) * per]:
                for _ in range(samples):
                    asked += 1
                    ids.append(f"r{asked}")
                    client.submit(RolloutRequest(rollout_id=ids[-1], task=prompt, policy_version=version))
            return ids

        t0 = time.perf_counter()
        for step in range(steps):
            for rid in ask(step, step):
                wait_for(client, rid)
        plain = time.perf_counter() - t0
        modes = []
        for name, ahead in (("synchronous", False), ("one step ahead", True)):
            staleness: Counter = Counter()
            waited = 0.0
            t0 = time.perf_counter()
            queued = ask(0, 0) if ahead else []
            for step in range(steps):
                ids = queued if ahead else ask(step, step)
                if ahead and step + 1 < steps:
                    queued = ask(step + 1, step)  # sampled by the weights of now, trained on at the next step
                w0 = time.perf_counter()
                results = [wait_for(client, rid) for rid in ids]
                waited += time.perf_counter() - w0
                staleness.update(step - r.policy_version for r in results)
                time.sleep(train_seconds)  # the optimizer step
            total = time.perf_counter() - t0
            modes.append((name, total, waited / total, staleness))
        client.close()
        server.close()
    return plain, modes


def weight_sync(out: Path) -> list[tuple[str, int, float, float, float]]:
    try:
        import torch  # noqa: F401
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from hermes_batch.llm.local_model import LocalModelServer, resolve_model_file
        from hermes_batch.rollout import write_gguf
        from tests import tiny_policy
    except ImportError as exc:
        print(f"  (skipped: {exc}; pip install -e '.[rl,local]')")
        return []
    rows = []
    small = (tiny_policy.policy(), tiny_policy.vocabulary_gguf(out / "vocab.gguf"))
    config = Qwen2Config(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
    medium = (Qwen2ForCausalLM(config), resolve_model_file(None, progress=False))
    for name, (model, vocabulary) in {"tiny (1,024 tokens)": small, "0.1 B (151,936 tokens)": medium}.items():
        write_gguf(model, out / "warm.gguf", vocabulary)  # the vocabulary read once per process, as in training
        t0 = time.perf_counter()
        path = write_gguf(model, out / f"{len(rows)}.gguf", vocabulary)
        written = time.perf_counter() - t0
        following = write_gguf(model, out / f"{len(rows)}-next.gguf", vocabulary)
        with LocalModelServer(path, threads=2, ctx=4096, parallel=1, log_path=out / "server.log") as server:
            loaded = server.load_seconds
            t0 = time.perf_counter()
            server.reload(following)  # the rollout service's swap: the running server restarted on the next weights
            swapped = time.perf_counter() - t0
        rows.append((name, sum(p.numel() for p in model.parameters()), written, loaded, swapped))
    return rows


def main(prompts: int = 16, samples: int = 4, steps: int = 4, train_seconds: float = 1.0) -> None:
    rows = [{"prompt": echoes(2, answer=f"done {i}"), "expected": f"done {i}"} for i in range(prompts)]
    with tempfile.TemporaryDirectory() as tmp, LlamaCppDouble() as double:
        out = Path(tmp)
        b = batch(double.base_url, rows, samples, out)
        s = stepped(double.base_url, rows, samples, steps, out)
        v, modes = served(double.base_url, rows, samples, steps, out, train_seconds)
        n = prompts * samples
        print(f"{n} rollouts ({prompts} prompts × {samples} samples, 3 model calls and 2 terminal calls each):")
        print(f"  one batch run        {b:6.1f} s  {n / b:5.1f} rollouts/s  {b / n * 1000:6.0f} ms a rollout")
        print(f"  {steps} trainer steps      {s:6.1f} s  {n / s:5.1f} rollouts/s  {s / n * 1000:6.0f} ms a rollout")
        print(f"  ratio                {s / b:6.2f}×  (ideal 1.0; {(s - b) / steps:.1f} s a step beyond the batch run)")
        print(f"  {f'{steps} service steps':20s} {v:6.1f} s  {n / v:5.1f} rollouts/s  {v / n * 1000:6.0f} ms a rollout")
        print(f"  ratio                {v / b:6.2f}×  (ideal 1.0; the service's workers stay warm)")
        print(f"a trainer on the service, {steps} steps with a {train_seconds:g} s optimizer step each:")
        for name, total, idle, staleness in modes:
            spread = ", ".join(f"{k}: {staleness[k]}" for k in sorted(staleness))
            print(f"  {name:16s} {total:6.1f} s  idle {idle:5.1%} (waiting for rollouts)  staleness {spread}")
        print("weight sync (write_gguf, llama.cpp loading the file, the service swapping a running server to it):")
        for name, params, written, loaded, swapped in weight_sync(out):
            print(f"  {name:24s} {params / 1e6:7.1f} M parameters  written {written:5.2f} s  loaded {loaded:5.2f} s  "
                  f"swapped {swapped:5.2f} s")


if __name__ == "__main__":
    fire.Fire(main)
