"""Who drives each prompt (`--agent`): the runner's own loop (`native`, agent.py), or a real agent
harness, unmodified, inside the prompt's sandbox (`hermes`: the Hermes Agent; `mini-swe-agent`),
its model calls answered through the runner (intercept.py) and its trajectory rebuilt from them
(transcript.py). Adding a harness is a module of this folder and a line in `HARNESSES`."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import BaseModel, field_validator

from ..backends import ExecResult, Sandbox, SandboxError, harness_backends
from ..checks.verdicts import write_files
from ..flags import flag
from ..llm import PromptFailed
from .base import Ending, Harness, Start
from .claude_code import ClaudeCode
from .codex import Codex
from .hermes import Hermes
from .install import installed
from .intercept import BASE_URL, Intercept, Line
from .mini_swe_agent import MiniSweAgent
from .transcript import fill, threads

HARNESSES: dict[str, Harness] = {h.name: h for h in (Hermes(), MiniSweAgent(), ClaudeCode(), Codex())}
NATIVE = "native"
MAX_ENDING = 4 * 1024 * 1024  # what a harness's driver may leave about how its loop ended


class HarnessSettings(BaseModel):
    agent: str = flag(NATIVE, "who drives each prompt: native (the runner's own loop), hermes (the Hermes Agent "
                              "itself), mini-swe-agent, claude-code (Claude Code) or codex (Codex), unmodified, in the "
                              "prompt's sandbox, its model calls through the runner")
    agent_version: str | None = flag(None, "the harness's published release to run (default: "
                                           + ", ".join(f"{h.name} {h.default_version}" for h in HARNESSES.values())
                                           + ")")

    @field_validator("agent")
    @classmethod
    def _agent(cls, v: str) -> str:
        if v != NATIVE and v not in HARNESSES:
            raise ValueError(f"no agent {v!r}: choose {', '.join([NATIVE, *HARNESSES])}")
        return v

    @property
    def harness(self) -> Harness | None:
        return HARNESSES.get(self.agent)

    @property
    def harness_release(self) -> str | None:
        """`hermes==0.19.0`: who drove the prompts, as records and the fingerprint name it."""
        harness = self.harness
        return f"{harness.name}=={self.agent_version or harness.default_version}" if harness else None


def harness_dir(settings: Any, progress: bool = True) -> str | None:
    """Where the run's harness is installed on this machine (installed now, once, if it is not)."""
    harness = settings.harness
    if harness is None:
        return None
    version = settings.agent_version or harness.default_version
    return str(installed(f"{harness.name}-{version}", harness.requirement(version), progress, harness.installer))


async def drive(harness: Harness, line: Line, box: Sandbox, *, prompt: str, task_id: str, model: str,
                toolsets: list[str], max_calls: int, timeout: float,
                home: dict[str, Any] | None = None) -> tuple[ExecResult, Ending | None]:
    """Run the harness on `prompt` in `box` until it ends (or `timeout`): what its command did, and
    how its loop ended where its driver says so. `home`: files (a row's `agent_home`) its state
    starts from, in place of an empty one."""
    seen = getattr(box, "harness_dir", None)  # where this sandbox sees the harness (each backend binds it where it can)
    if seen is None:
        raise PromptFailed("harness_unavailable", f"this sandbox does not see the {harness.name} harness (the "
                                                  f"{', '.join(harness_backends())} backends bind it)")
    if harness.python:
        wanted = ".".join(map(str, harness.python))
        found = await box.exec("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", timeout=60)
        if found.stdout.strip() != wanted:
            raise PromptFailed("harness_unavailable", f"the {harness.name} harness runs on the sandbox's python3 "
                                                      f"{wanted}, and this image's is {found.stdout.strip() or 'missing'}")
    where = f"{getattr(box, 'scratch', '/tmp').rstrip('/')}/.hermes-batch-harness"
    start: Start = harness.start(prompt=prompt, task_id=task_id, model=model, base_url=BASE_URL, key=line.key,
                                 toolsets=toolsets, max_calls=max_calls, home=f"{where}/home")
    for name, data in start.files.items():
        await box.write_file(f"{where}/{name}", data)
    if home:
        await write_files(box, home, under=f"{where}/home")
    argv = [word.replace("{dir}", where).replace("{harness}", seen) for word in start.argv]
    done = await box.exec(shlex.join(argv), timeout=timeout, env={**start.env, "PYTHONPATH": seen})
    return done, (await _ending(box, f"{where}/{start.ending}") if start.ending else None)


async def _ending(box: Sandbox, path: str) -> Ending | None:
    """What the harness's driver left there: the sandbox's to write, so read as data and checked."""
    try:
        said = json.loads(await box.read_file(path, MAX_ENDING))
        unsent = said.get("unsent") or []
        return Ending(str(said["status"]), said.get("finished") is True,
                      [m for m in unsent if isinstance(m, dict)] if isinstance(unsent, list) else [])
    except (OSError, SandboxError, ValueError, KeyError, TypeError, AttributeError):
        return None


__all__ = ["BASE_URL", "HARNESSES", "NATIVE", "Ending", "Harness", "HarnessSettings", "Intercept", "Line", "drive", "fill",
           "harness_dir", "threads"]
