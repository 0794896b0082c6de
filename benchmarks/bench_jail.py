"""What a local command costs in machine CPU, jailed and not, one after another on a quiet machine.

    python benchmarks/bench_jail.py [--rounds=300]

- unjailed: `bash -c 'echo hi'` as a plain subprocess (what `--local_isolation=none` pays);
- the least a bubblewrap jail can be: bwrap with only a mount and a PID namespace over the host's
  root, then the same command (no network namespace, no own /proc or /dev, no user change);
- the local backend's jail made for one command (the isolation every prompt gets: namespaces,
  mounts, `setpriv` to `nobody`), as it was used for every command before jails lived per prompt;
- a prompt's directories alone, made and removed (what every prompt with a tool call pays): plain
  directories, and (as root) on a filesystem of `--disk` bytes of the prompt's own;
- a prompt's sandbox with one command: its directories and jail are made, the command handed to
  the shell in it, the jail closed and the directories removed (what a one-command prompt pays);
- one more command in a live prompt jail (what each further command of a prompt pays), and the
  same after thousands of commands in that jail (it must not grow with them).

Machine CPU is every core's busy time (kernel work included), per command, over `rounds`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_throughput import machine_busy_seconds  # noqa: E402

from hermes_batch.backends.base import BackendSettings, SandboxSpec  # noqa: E402
from hermes_batch.backends.local import _JAIL_PATH, Jail, LocalBackend  # noqa: E402
from hermes_batch.runner.worker import _watch_children_with_pidfds  # noqa: E402

COMMAND = ["bash", "-c", "echo hi"]
LONG_PROMPT = 2000  # commands run in one prompt's jail before the last figure


def per_round(rounds: int, one) -> float:
    """ms of machine CPU per call of `one` (a few warm-up calls first; the kernel's deferred
    namespace teardown is waited for)."""
    for _ in range(5):
        one()
    time.sleep(0.3)
    busy = machine_busy_seconds()
    for _ in range(rounds):
        one()
    time.sleep(0.5)
    return (machine_busy_seconds() - busy) / rounds * 1000


def run_quietly(argv: list[str], pass_fds: tuple[int, ...] = ()) -> None:
    subprocess.run(argv, env={"PATH": _JAIL_PATH}, stdout=subprocess.DEVNULL, check=True, pass_fds=pass_fds)


def jailed_once(jail: Jail, top: Path, owner: int) -> None:
    """One command in a jail of its own, with the seccomp program every jail gets."""
    fd = jail.filter_fd()
    try:
        run_quietly(jail.argv(str(top), COMMAND, owner=owner, filter_fd=fd), pass_fds=(fd,))
    finally:
        os.close(fd)


def measure(rounds: int = 300) -> dict[str, float]:
    figures = {"unjailed": per_round(rounds, lambda: run_quietly(COMMAND)),
               "least bwrap jail": per_round(rounds, lambda: run_quietly(
                   ["bwrap", "--unshare-pid", "--ro-bind", "/", "/", *COMMAND]))}
    with tempfile.TemporaryDirectory(prefix="hb-jail-") as tmp:
        top = Path(tmp) / "p"
        for name in ("work", "tmp"):
            (top / name).mkdir(parents=True)
        jail = Jail(network=False, pids_limit=256)
        owner = jail.owner()
        for name in ("work", "tmp"):
            os.chown(top / name, owner, owner)
        figures["jail per command"] = per_round(rounds, lambda: jailed_once(jail, top, owner))
        _watch_children_with_pidfds()  # as a worker does
        figures.update(asyncio.run(_in_prompt_jails(tmp, rounds)))
    return figures


async def _in_prompt_jails(tmp: str, rounds: int) -> dict[str, float]:
    backend = LocalBackend(BackendSettings(run_label="bench-jail", sandbox_root=tmp, local_isolation="bwrap"))
    await backend.setup()
    plain = LocalBackend(BackendSettings(run_label="bench-jail-plain", sandbox_root=tmp, local_isolation="bwrap"))
    await plain.setup()
    plain.disks.template = None  # plain directories, as where --disk cannot be enforced
    loop = asyncio.get_running_loop()

    def sync(coro_fn):
        return lambda: asyncio.run_coroutine_threadsafe(coro_fn(), loop).result()

    async def one_command_prompt() -> None:
        sandbox = await backend.start(SandboxSpec(prompt_id="p"))
        await sandbox.exec("echo hi", timeout=30)
        await sandbox.close()

    async def directories_only() -> None:
        sandbox = await backend.start(SandboxSpec(prompt_id="p"))
        await sandbox.close()

    async def plain_directories() -> None:
        sandbox = await plain.start(SandboxSpec(prompt_id="p"))
        await sandbox.close()

    live = await backend.start(SandboxSpec(prompt_id="live"))

    async def further_command() -> None:
        await live.exec("echo hi", timeout=30)

    # the measuring loop runs in a thread so that the event loop serves the sandboxes meanwhile
    bare = await asyncio.to_thread(per_round, rounds, sync(plain_directories))
    directories = await asyncio.to_thread(per_round, rounds, sync(directories_only))
    prompt = await asyncio.to_thread(per_round, rounds, sync(one_command_prompt))
    further = await asyncio.to_thread(per_round, rounds, sync(further_command))
    for _ in range(LONG_PROMPT):
        await further_command()
    late = await asyncio.to_thread(per_round, rounds, sync(further_command))
    await live.close()
    bounded = backend.disks.template is not None
    return {"a prompt's directories, made and removed": bare,
            f"the same on a filesystem of --disk{'' if bounded else ' (not here: not root)'}": directories,
            "prompt jail, one command": prompt,
            "further command in a prompt jail": further,
            f"the same after {LONG_PROMPT + rounds + 5:,} commands in it": late}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=300)
    args = p.parse_args()
    for label, ms in measure(args.rounds).items():
        print(f"  {label:<42} {ms:5.2f} ms of machine CPU")


if __name__ == "__main__":
    main()
