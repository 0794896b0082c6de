"""Command line: `python batch_runner.py --flag=value ...` (python-fire).

The flags are the fields of `RunConfig` (config.py), plus `--list_distributions` and `--help`.
Nothing is defaulted here, so that `--resume` can tell what the user changed: a resumed run takes
its stored settings, and the flags given now override them.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic_core import PydanticUndefined

import distributions

from .config import REQUIRED, flags
from .errors import EXIT_INTERRUPTED, HermesError
from .run import RunResult, configure, run, say
from .tools import TOOLSETS

ACTIONS = {"list_distributions": "print the toolset distributions and exit", "help": "print this"}
USAGE = """Run a JSONL dataset of prompts through a tool-using agent and write ShareGPT trajectories.

  python batch_runner.py --dataset_file=prompts.jsonl --run_name=NAME [--flag=value ...]
  python batch_runner.py --run_name=NAME --resume      continue a run: settled prompts are skipped
  python batch_runner.py --dataset_file=... --run_name=... --model=local   offline, the embedded model

Every flag is described in README.md."""


def main(**given: Any) -> None:
    """Run a JSONL dataset of prompts through a tool-using agent (see --help)."""
    if given.keys() & {"help", "h"}:
        print_help()
        return
    unknown = [name for name in given if name not in flags() and name not in ACTIONS]
    if unknown:
        say(f"error: {unknown_flags(unknown)}")
        raise SystemExit(1)
    if given.pop("list_distributions", None):
        print_distributions()
        return
    code = invoke({k: v for k, v in given.items() if v is not None})
    if code:
        raise SystemExit(code)


def invoke(given: dict[str, Any]) -> int:
    """Configure, run and report; the exit code."""
    try:
        result = run(configure(given))
    except HermesError as exc:
        say(f"{exc.label}: {exc}")
        return exc.code
    except KeyboardInterrupt:  # outside the dispatch loop (loading the model, pre-flight, the final merge)
        say("stopped: interrupted; rerun with --resume to go on")
        return EXIT_INTERRUPTED
    report(result)
    if result.aborted is not None:
        say(f"{result.aborted.label}: {result.aborted}")
    return result.exit_code


def unknown_flags(unknown: list[str]) -> str:
    known = [*flags(), *ACTIONS]
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        lines.append(f"unknown flag --{name}" + (f" (did you mean --{close[0]}?)" if close else ""))
    return "\n".join(lines) + "\nsee README.md or --help for every flag"


def print_help() -> None:
    print(USAGE)
    print("\nFlags (default):")
    for name, field in flags().items():
        default = "required" if name in REQUIRED else ("-" if field.default in (None, PydanticUndefined) else field.default)
        print(f"  --{name:<26} {str(default):<20} {field.description or ''}")
    for name, text in ACTIONS.items():
        print(f"  --{name:<26} {'':<20} {text}")


def print_distributions() -> None:
    for name, dist in distributions.available().items():
        print(f"{name}: {dist.description}")
        for toolset, pct in sorted(dist.toolsets.items(), key=lambda kv: (-kv[1], kv[0])):
            tools = ", ".join(TOOLSETS.get(toolset, ["?"]))
            print(f"    {toolset:<10} {pct:>5.0f}%   ({tools})")
    print("\nToolsets are drawn independently per prompt; at least one is always offered.")


def report(result: RunResult) -> None:
    c, config, stats = result.counts, result.config, result.stats
    say(f"this invocation: {c['done']} done, {c['discarded']} discarded, {c['failed']} failed")
    for line in stats.summary_lines():
        say(line)
    say(f"{stats.trajectories} trajectories in {result.trajectories_path}; statistics in {result.statistics_path}")
    if result.outstanding:
        say(f"{result.outstanding} prompt(s) not finished ({result.failed_outstanding} failed): rerun with --resume")
    if c["discarded"] and config.require_reasoning and not c["done"]:
        say("every trajectory was discarded for lacking reasoning; for a model without reasoning pass --require_reasoning=False")


def entry() -> None:
    import fire

    fire.Fire(main)


__all__ = ["entry", "main"]
