"""Command line (python-fire):

    python batch_runner.py --flag=value ...                   a run: the flags are RunConfig's fields
    python batch_runner.py export --run_name=NAME --output=PATH [--format=openai|sharegpt|sts] ...
    python batch_runner.py view --run_name=NAME [--output=report.html]
    python batch_runner.py validate --dataset_file=PATH [--backend=...]   are the dataset's checks right?
    python batch_runner.py recheck --run_name=NAME [--dataset_file=...]  score a run again with its checks now

A run's flags are not defaulted here, so that `--resume` can tell what the user changed: a
resumed run takes its stored settings, and the flags given now override them.
"""

from __future__ import annotations

import difflib
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic_core import PydanticUndefined

from . import distributions
from .backends import REGISTRY, all_flags
from .config import REQUIRED, configure, explain_validation_error, flags, is_flag
from .errors import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, HermesError
from .llm import ModelSettings
from .runner import RunResult, run
from .store import RunStore, disk_full
from .tools import TOOLSETS
from .util import say

ACTIONS = {"list_distributions": "print the toolset distributions and exit", "help": "print this"}
# `export` and `view` are the other commands: `python batch_runner.py export --help`
USAGE = """Run a JSONL dataset of prompts through a tool-using agent and write ShareGPT trajectories.

  python batch_runner.py --dataset_file=prompts.jsonl --run_name=NAME [--flag=value ...]
  python batch_runner.py --run_name=NAME --resume      continue a run: settled prompts are skipped
  python batch_runner.py --dataset_file=... --run_name=... --model=local   offline, the embedded model

  python batch_runner.py export --run_name=NAME --output=train.parquet   training files (export --help)
  python batch_runner.py view --run_name=NAME                              an HTML report of the run
  python batch_runner.py validate --dataset_file=...   the checks against the untouched task and its reference solution
  python batch_runner.py recheck --run_name=NAME       score a run again with fixed checks (--save_workspace)
  python batch_runner.py serve --dataset_file=... --run_name=NAME   rollouts for a trainer, over HTTP (docs/training.md)

Every flag is described in docs/flags.md."""


def main(*command: str, **given: Any) -> None:
    """Run a JSONL dataset of prompts through a tool-using agent (see --help)."""
    if command:
        raise SystemExit(subcommand(command, given))
    if given.keys() & {"help", "h"}:
        print_help()
        return
    if unknown_run_flags({k: v for k, v in given.items() if k not in ACTIONS}):
        raise SystemExit(1)
    if given.pop("list_distributions", None):
        print_distributions()
        return
    code = invoke({k: v for k, v in given.items() if v is not None})
    if code:
        raise SystemExit(code)


def invoke(given: dict[str, Any]) -> int:
    """Configure, run and report; the exit code. A Ctrl-C at any moment exits EXIT_INTERRUPTED (what
    was done is recorded, and --resume goes on), whatever the code it landed in made of it."""
    with CtrlC() as ctrl_c:
        try:
            result = run(configure(given))
            report(result)
        except KeyboardInterrupt:  # outside the dispatch loop (loading the model, pre-flight, the final merge)
            return interrupted()
        except Exception as exc:
            if ctrl_c.pressed:  # an error on the Ctrl-C's way (a helper process it killed), not the run's
                return interrupted()
            if isinstance(exc, HermesError):
                say(f"{exc.label}: {exc}")
                return exc.code
            if isinstance(exc, OSError):
                say(f"error: {os_problem(exc)}")
                return EXIT_FATAL
            raise
        if result.aborted is not None:
            say(f"{result.aborted.label}: {result.aborted}")
        if ctrl_c.pressed and result.exit_code != EXIT_INTERRUPTED:  # the pool's stop took it for "stop waiting"
            return interrupted()
        return result.exit_code


def interrupted() -> int:
    say("stopped: interrupted; rerun with --resume to go on")
    return EXIT_INTERRUPTED


class CtrlC:
    """Notes a Ctrl-C during a run, and raises KeyboardInterrupt as Python's own handler does.

    Not Python's own handler, with which asyncio.run (the pre-flight) turns a Ctrl-C into a
    cancellation its task sees at its next await only: a helper process that the task waited on
    meanwhile, killed by the same Ctrl-C (ldconfig, as pyseccomp is first imported), failed the
    run with an error of its own, exit 1. An ignored SIGINT (a background job) stays ignored."""

    def __init__(self) -> None:
        self.pressed = False
        self._before: Any = None

    def __enter__(self) -> CtrlC:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._before = signal.signal(signal.SIGINT, self._note)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)

    def _note(self, signum: int, frame: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt


def subcommand(command: tuple[str, ...], given: dict[str, Any]) -> int:
    """One of COMMANDS; the exit code."""
    name = command[0]
    if len(command) > 1 or name not in COMMANDS:
        say(f"error: unknown command {' '.join(map(str, command))!r}; the commands are: {', '.join(COMMANDS)} "
            "(a run takes only --flags)")
        return EXIT_FATAL
    return COMMANDS[name](given)


def with_options(name: str, model: Any, given: dict[str, Any], command: Callable[[Any], int]) -> int:
    """A command whose flags are the fields of a pydantic model: its --help, unknown flags, bad values."""
    from pydantic import ValidationError

    if given.keys() & {"help", "h"}:
        print(f"python batch_runner.py {name} --flag=value ...\n\nFlags (default):")
        for flag, field in model.model_fields.items():
            default = "required" if field.is_required() else ("-" if field.default is None else field.default)
            print(f"  --{flag:<22} {str(default):<14} {field.description or ''}")
        return EXIT_OK
    unknown = [flag for flag in given if flag not in model.model_fields]
    if unknown:
        say(f"error: {unknown_flags(unknown, list(model.model_fields))}")
        return EXIT_FATAL
    try:
        opts = model(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        say(f"error: {explain_validation_error(exc)}")
        return EXIT_FATAL
    return reported(lambda: command(opts))


def export_command(given: dict[str, Any]) -> int:
    from .export import ExportOptions

    return with_options("export", ExportOptions, given, export_run)


def view_command(given: dict[str, Any]) -> int:
    from .view import ViewOptions

    return with_options("view", ViewOptions, given, view_run)


def reported(command: Callable[[], int]) -> int:
    """A command's exit code; what the user must fix is said in one line."""
    try:
        return command()
    except HermesError as exc:
        say(f"{exc.label}: {exc}")
        return exc.code
    except OSError as exc:
        say(f"error: {os_problem(exc)}")
        return EXIT_FATAL


def unknown_run_flags(given: dict[str, Any]) -> bool:
    """Says which of the flags given a run (and its backend) does not take."""
    unknown = [name for name in given if not is_flag(name, given.get("backend"))]
    if unknown:
        say(f"error: {unknown_flags(unknown)}")
    return bool(unknown)


def validate_checks(given: dict[str, Any]) -> int:
    """`validate`: a run's dataset and sandbox flags (no model is asked); the exit code."""
    from .runner import validate as validating

    if given.keys() & {"help", "h"}:
        print("python batch_runner.py validate --dataset_file=PATH [--backend=... and its flags] "
              "[--check_timeout=S] [--pass_score=X] [--max_sandboxes=N]\n" + (validating.__doc__ or ""))
        return EXIT_OK
    if unknown_run_flags(given):
        return EXIT_FATAL
    flags = {"run_name": "validate", **{k: v for k, v in given.items() if v is not None}}
    return reported(lambda: validating.validate(configure(flags)))


def recheck_run(given: dict[str, Any]) -> int:
    """`recheck`: the run's stored settings, its dataset (or a fixed one), no agent; the exit code."""
    from .runner import recheck

    if given.keys() & {"help", "h"}:
        print("python batch_runner.py recheck --run_name=NAME [--dataset_file=FIXED.jsonl] [--output_dir=...] "
              "[sandbox flags]\n" + (recheck.__doc__ or ""))
        return EXIT_OK
    if "run_name" not in given:
        say("error: --run_name is required (the run to score again)")
        return EXIT_FATAL
    if unknown_run_flags(given):
        return EXIT_FATAL

    def rescored() -> int:
        config = configure({**{k: v for k, v in given.items() if v is not None}, "resume": True})
        if not RunStore(config.run_dir).has_outputs():
            say(f"error: no run at {config.run_dir} (check --run_name and --output_dir)")
            return EXIT_FATAL
        result = run(config, rescore=True)
        report(result)
        return result.exit_code

    return reported(rescored)


def serve_rollouts(given: dict[str, Any]) -> int:
    """`serve`: a run's flags and the service's own (--host, --port, --max_queued); the exit code."""
    from .rollout.service import http_api, rollouts

    if given.keys() & {"help", "h"}:
        print("python batch_runner.py serve --dataset_file=PATH --run_name=NAME [run flags] [--host=127.0.0.1] "
              "[--port=8177] [--max_queued=N]\n\n" + (rollouts.__doc__ or "") + "\n\n" + (http_api.__doc__ or ""))
        return EXIT_OK
    own: dict[str, Any] = {k: given.pop(k) for k in ("host", "port", "max_queued") if k in given}
    if unknown_run_flags(given):
        return EXIT_FATAL
    for flag, top in (("port", 65535), ("max_queued", None)):
        value = own.get(flag, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (top and value > top):
            say(f"error: --{flag}={value!r}: give " + (f"a port from 1 to {top}" if top else "a whole number above 0"))
            return EXIT_FATAL
    if "host" in own and not isinstance(own["host"], str):
        own["host"] = str(own["host"])
    return reported(lambda: http_api.serve({k: v for k, v in given.items() if v is not None}, **own))


def os_problem(exc: OSError) -> str:
    """A path the user named that cannot be made, read or written, in one line."""
    where = f" {exc.filename}" if exc.filename else ""
    if disk_full(exc):
        return f"no space left on the disk of{where}: free space, then run again (a run: with --resume)"
    return f"cannot create, read or write{where}: {exc.strerror or exc}"


def export_run(opts: Any) -> int:
    from .export import compression_for, export, push_to_hub
    from .export.clean import cleaner_for

    output = Path(opts.output)
    with compression_for(opts, say) as compression, cleaner_for(opts, say, compression) as cleaner:
        report = export(opts.run_dirs, opts.format, output, opts.filters,
                        on_problem=lambda pid, why: say(f"left out {pid}: {why}"), curation=opts.curation,
                        compression=compression, images=opts.image_options, cleaner=cleaner)
    done = "would be exported (a dry run: nothing written)" if opts.dry_run else f"exported to {output} ({opts.format})"
    parts = [f"{report.written} {'pairs' if report.pairs else 'trajectories'} {done}"]
    if compression is not None:  # how many it shortened, and whether a model had to start for it
        started = compression.embedded is not None and compression.embedded.started
        parts.append(f"{report.compressed} compressed to fit --max_tokens={opts.max_tokens}" + (
            "" if compression.over else " (none was over it)" if started else " (none was over it: no model was started)"))
    if report.filtered:
        parts.append("filtered out: " + ", ".join(f"{n} {why}" for why, n in report.filtered.most_common()))
    if report.images_over_cap:
        parts.append(f"{report.images_over_cap} images over --max_image_bytes named, not inlined")
    if report.invalid:
        parts.append(f"{len(report.invalid)} left out as it would train wrongly (see above)")
    say("; ".join(parts))
    for line in cleaning_lines(report.cleaning):
        say(line)
    if report.legacy:
        say(f"note: {report.legacy} of them were written by an older version, which stored a tool result that looked "
            "like JSON as a JSON value: it is written back as JSON text (1e3 as 1000.0, a final newline lost); run "
            "those prompts again for tool outputs exactly as the model read them")
    if report.card is not None:
        say(f"dataset card: {report.card}")
    if opts.push_to_hub and not opts.dry_run:
        say(f"uploaded to {push_to_hub(output, opts.push_to_hub, opts.format, report.card)}")
    return EXIT_OK


def cleaning_lines(c: Any) -> list[str]:
    """What an export's cleaning found, a line a step (export/clean/)."""
    lines = []
    if c.cleaning.dedup != "off":
        d = c.duplicates
        lines.append(f"duplicates ({c.cleaning.dedup}): {d['exact'] + d['near']} left out of {c.surveyed} "
                     f"({d['exact']} exact, {d['near']} near; {d['within a prompt']} within a prompt, "
                     f"{d['across prompts']} across prompts; kept: the {c.cleaning.keep} one)")
    for b in c.benchmarks:
        n = c.contaminated[b["source"]]
        lines.append(f"contamination: {n} of {c.surveyed} rows share a {b['ngram']}-gram with {b['source']} "
                     f"({b['items']} items; index {'cached' if b['cached'] else 'built'})"
                     + (f": {'left out' if c.cleaning.contaminated == 'drop' else 'flagged'}" if n else ""))
    masked = ", ".join(f"{n} {kind}" for kind, n in sorted(c.masked.items()))
    looked = ", ".join(["the run's keys", *c.cleaning.scrub])
    if c.cleaning.scrub or c.masked:
        lines.append(f"masked ({looked}): " + (f"{masked} in {c.rows_masked} rows" if masked else "nothing found")
                     + (f"; {c.not_token_exact} token rows re-tokenised there (token_exact: false)"
                        if c.not_token_exact else ""))
    if c.short_keys:
        lines.append(f"warning: the run's keys from {', '.join(c.short_keys)} are shorter than 8 characters: they cannot "
                     "be told from text and are not masked")
    return lines


def view_run(opts: Any) -> int:
    from .view import write_report

    if len(opts.run_dirs) > 1:
        from .view import compare_runs, summary_lines, write_page

        result = compare_runs(opts.run_dirs)
        for line in summary_lines(result):
            say(line)
        write_page(result, opts.output_path)
        say(f"side by side: open {opts.output_path}")
        return EXIT_OK
    shown, total = write_report(opts.run_dir, opts.output_path, opts.limit)
    more = f" (the first {shown} in the table; the charts count all)" if shown < total else ""
    say(f"{total} trajectories{more}: open {opts.output_path}")
    return EXIT_OK


def unknown_flags(unknown: list[str], known: list[str] | None = None) -> str:
    known = known if known is not None else [*flags(), *all_flags(), *ACTIONS]
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        lines.append(f"unknown flag --{name}" + (f" (did you mean --{close[0]}?)" if close else ""))
    return "\n".join(lines) + "\nsee --help or docs/flags.md for every flag"


def print_help() -> None:
    print(USAGE)
    run_flags = flags()
    model = {name: run_flags.pop(name) for name in list(run_flags) if name in ModelSettings.model_fields}
    for title, group in (("Flags (default)", run_flags), ("Model flags", model)):
        print(f"\n{title}:")
        for name, field in group.items():
            _help_line(name, field, "required" if name in REQUIRED else field.default, field.description)
    for name, text in ACTIONS.items():
        print(f"  --{name:<26} {'':<20} {text}")
    print("\nSandbox flags (each backend declares its own; the backends that read one are named):")
    for name, (field, owners) in all_flags().items():
        readers = "" if len(owners) == len(REGISTRY) else f" [{', '.join(owners)}]"
        _help_line(name, field, field.default, f"{field.description}{readers}")


def _help_line(name: str, field: Any, default: Any, text: str | None) -> None:
    default = "-" if default in (None, PydanticUndefined) else default
    choices = [str(c) for c in _choices(field.annotation)]
    if choices and not all(c in (text or "") for c in choices):
        text = f"{text} (one of: {', '.join(choices)})"
    print(f"  --{name:<26} {str(default):<20} {text or ''}")


def _choices(annotation: Any) -> list[Any]:
    """The values of a flag with a fixed set (a Literal, perhaps optional)."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [c for arg in get_args(annotation) for c in _choices(arg)]


def print_distributions() -> None:
    for name, dist in distributions.available().items():
        print(f"{name}: {dist.description}" + (" (the reference's)" if dist.reference else ""))
        for toolset, pct in sorted(dist.toolsets.items(), key=lambda kv: (-kv[1], kv[0])):
            tools = ", ".join(TOOLSETS.get(toolset, ["?"]))
            print(f"    {toolset:<10} {pct:>5.0f}%   ({tools})")
    print("\nToolsets are drawn independently per prompt; at least one is always offered.")


def report(result: RunResult) -> None:
    c, config, stats = result.counts, result.config, result.stats
    say(f"this invocation: {c['done']} done, {c['discarded']} discarded, {c['failed']} failed")
    if not result.merged:
        return  # the stop's own message says why, and what to do
    say("across the whole run:")  # every invocation of it: statistics.json says the same
    for line in stats.summary_lines():
        say(line)
    say(f"{stats.trajectories} trajectories in {result.trajectories_path}; statistics in {result.statistics_path}")
    if result.outstanding:
        say(f"{result.outstanding} prompt(s) not finished ({result.failed_outstanding} failed): rerun with --resume")
    if c["discarded"] and config.require_reasoning and not c["done"]:
        say("every trajectory was discarded for lacking reasoning; for a model without reasoning pass --require_reasoning=False")


class _ClosedPipeTolerant:
    """A stream whose reader may go away (`| head`): what is written after that goes nowhere, and
    the run, whose real output is its files, goes on."""

    def __init__(self, stream: Any):
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone = True
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# the commands beside a run, in the order --help and errors name them
COMMANDS: dict[str, Callable[[dict[str, Any]], int]] = {
    "export": export_command, "view": view_command, "validate": validate_checks, "recheck": recheck_run,
    "serve": serve_rollouts,
}


def entry() -> None:
    import fire

    sys.stdout, sys.stderr = _ClosedPipeTolerant(sys.stdout), _ClosedPipeTolerant(sys.stderr)
    fire.Fire(main)


__all__ = ["entry", "main"]
