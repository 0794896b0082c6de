"""What a Docker sandbox costs against the raw engine, side by side in one run.

    python benchmarks/bench_sandbox.py [--image=hermes-batch-sandbox:bookworm] [--rounds=40]

Warm exec: `sandbox.exec("true")` on a started sandbox against the same container driven
directly through the Docker SDK (exec_create + exec_start + exec_inspect, what `docker exec`
does). Start: `backend.start()` (create, start, and whatever the sandbox needs before its first
command) against a raw `containers.create` + `start` with the same options; removal is outside
both timings. Medians of `rounds` tries, interleaved so the engine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_batch.backends import load_backend  # noqa: E402
from hermes_batch.backends.base import SandboxSpec  # noqa: E402


async def measure(image: str, rounds: int) -> dict[str, float]:
    backend = load_backend("docker", {"image": image, "run_label": "bench-sandbox"})
    await backend.setup()
    api = backend.client.api  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {"exec": [], "raw_exec": [], "start": [], "raw_start": []}
    try:
        await backend.prepare_image(image)
        warm = await backend.start(SandboxSpec(prompt_id="warm"))
        await warm.exec("true", timeout=30)

        def raw_exec() -> None:
            exec_id = api.exec_create(warm.id, ["true"], stdout=True, stderr=True)["Id"]  # type: ignore[attr-defined]
            api.exec_start(exec_id)
            api.exec_inspect(exec_id)

        def raw_start() -> str:
            c = backend.client.containers.create(  # type: ignore[attr-defined]
                image, ["sleep", "infinity"], detach=True, init=True, network_mode="none", read_only=True,
                tmpfs={"/tmp": "rw,exec,nosuid,size=1g"}, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                pids_limit=256, mem_limit="1g", nano_cpus=10**9, labels={"hermes-batch.run": "bench-sandbox"})
            c.start()
            return c.id

        for i in range(rounds):
            t = time.perf_counter()
            await warm.exec("true", timeout=30)
            times["exec"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await asyncio.to_thread(raw_exec)
            times["raw_exec"].append(time.perf_counter() - t)
            if i % 4 == 0:  # starts are slower: a quarter as many
                t = time.perf_counter()
                box = await backend.start(SandboxSpec(prompt_id=f"b{i}"))
                times["start"].append(time.perf_counter() - t)
                await box.close()
                t = time.perf_counter()
                cid = await asyncio.to_thread(raw_start)
                times["raw_start"].append(time.perf_counter() - t)
                await asyncio.to_thread(api.remove_container, cid, force=True)
        await warm.close()
    finally:
        await backend.sweep_orphans()
        await backend.shutdown()
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", default="hermes-batch-sandbox:bookworm")
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    m = asyncio.run(measure(args.image, args.rounds))
    print(f"docker warm exec: sandbox {m['exec']:.1f} ms, raw SDK {m['raw_exec']:.1f} ms → "
          f"{m['exec'] / m['raw_exec']:.2f}× (target ≤ 1.1×)")
    print(f"docker start:     sandbox {m['start']:.1f} ms, raw create+start {m['raw_start']:.1f} ms → "
          f"{m['start'] / m['raw_start']:.2f}× (target ≤ 1.1×)")


if __name__ == "__main__":
    main()
