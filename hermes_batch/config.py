"""Run configuration: every CLI flag, validated once, plus the fingerprint that guards `--resume`."""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from .agent import AgentSettings
from .backends import (
    REGISTRY,
    BackendSettings,
    flag_owner,
    harness_backends,
    sandbox_settings,
    settings_class,
    uses_images,
)
from .checks import CheckSettings, Judge
from .errors import UserError
from .flags import CommaList, Text, flag
from .harness import HarnessSettings
from .llm import ModelSettings
from .llm.local_model import DEFAULT_WEIGHTS, LOCAL_MODEL_NAME, LocalModelSettings
from .store import RunLocation, RunStore
from .store.workspace import WorkspaceSettings
from .tools import REGISTRY as TOOLSET_REGISTRY
from .tools import SETTINGS as TOOLSET_SETTINGS

# What `--model=local` changes when the flag is not given (docs/embedded-model.md says why).
LOCAL_MODEL_DEFAULTS = {
    "require_reasoning": False,  # it writes no reasoning: the filter would discard every sample
    "distribution": "offline",  # an offline model, offered no web tools
    "num_workers": 1, "concurrency": 2,  # two llama.cpp slots on a few cores; more loops only queue
    "max_tokens": 1024,  # a 1.5B model can ramble; bounded replies keep a trajectory under a minute or two
    "first_tool_choice": "required",  # left to choose, it describes the work in prose half the time
}

# Settings that change what a trajectory looks like: a resume that changes one of them would mix
# two different datasets in one run, so it is refused unless --allow_config_change is given.
FINGERPRINTED = (
    "model", "distribution", "toolsets", "max_turns", "reasoning_effort", "reasoning_disabled",
    "max_tokens", "temperature", "ephemeral_system_prompt", "prefill_messages", "require_reasoning",
    "backend", "image", "command_timeout", "first_tool_choice",
)
# Flags that only steer this one invocation; they are neither stored with the run nor fingerprinted.
PER_INVOCATION = ("resume", "verbose", "api_key", "allow_config_change", "overwrite")
REQUIRED = ("dataset_file", "run_name")  # dataset_file may come from the stored run on --resume
BACKENDS = tuple(REGISTRY)


class ConfigError(UserError):
    """A flag or file the user gave is wrong; the message says which and why."""


# the slices of a run's configuration its components declare, in the order `--help` lists them after the run's own
SLICES: tuple[type[BaseModel], ...] = (RunLocation, ModelSettings, HarnessSettings, AgentSettings, *TOOLSET_SETTINGS,
                                       CheckSettings, WorkspaceSettings, LocalModelSettings)


class RunConfig(*reversed(SLICES)):  # type: ignore[misc]
    """Every flag of a run: the run's own fields here, then the slices its components declare
    (`SLICES`: the model client's, the agent loop's, the tools' and each toolset's, the checks', the
    workspace's, the embedded model's; the backend's, `sandbox`, from its own settings). The CLI is
    flat; a component reads its own slice (`slice`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset_file: Text | None = flag(None, "JSONL dataset, one {\"prompt\": ...} per line (on --resume, the run's)")
    batch_size: int = flag(10, "prompts per output shard batch_<k>.jsonl", ge=1)
    num_workers: int = flag(4, "worker processes", ge=1, le=256)
    concurrency: int = flag(64, "agent loops in flight across all workers", ge=1)
    max_sandboxes: int | None = flag(None, "live sandboxes across all workers (default: --concurrency)", ge=1)
    max_samples: int | None = flag(None, "use only the first N valid rows", ge=1)
    resume: bool = flag(False, "continue the run: settled prompts are skipped, failed ones retried")
    overwrite: bool = flag(False, "delete an existing run's outputs and start again")
    allow_config_change: bool = flag(False, "let --resume go on although fingerprinted settings changed, or with "
                                                 "another --dataset_file than the run's")
    verbose: bool = flag(False, "more messages (every failure, endpoint notes)")
    executor: Literal["local", "ray"] = flag("local", "where agent loops run: local worker processes, or a Ray cluster")
    ray_address: str | None = flag(None, "--executor=ray: `auto`, host:port or ray://host:port (default: a local Ray)")
    # the model's key, and what the whole run may spend
    api_key: SecretStr | None = flag(None, "else OPENROUTER_API_KEY, else OPENAI_API_KEY; never stored")
    max_cost: float | None = flag(None, "USD the whole run may spend (as the provider reports it)", gt=0)
    max_total_tokens: int | None = flag(None, "tokens the whole run may spend", ge=1)
    max_attempts: int = flag(3, "runs of a failing prompt before --resume stops retrying it", ge=1)
    samples: int = flag(1, "runs of each prompt, each in its own sandbox with its own seed (pass@k; raise it on "
                           "--resume to run only the new ones)", ge=1, le=1000)
    # what the agent is offered, and what is kept
    distribution: Text = flag("default", "toolset distribution name, or a path to a .toml file")
    toolsets: CommaList | None = flag(None, "comma list of toolsets; bypasses sampling")
    require_reasoning: bool = flag(True, "discard samples with no reasoning turn")
    # sandboxes: the backend, then the flags its own settings declare (backends/, `--help` lists them)
    backend: str = flag("local", "where sandboxes run: " + ", ".join(BACKENDS))
    sandbox: SerializeAsAny[BackendSettings] = Field(default_factory=BackendSettings)  # not a flag: the backend's
    # what the run's MCP servers listed when started at the run's start (tools/mcp); not a flag, not stored
    mcp_listed: dict[str, list[dict[str, Any]]] | None = None
    _memo: dict[Any, Any] = PrivateAttr(default_factory=dict)  # what the run's files say, read once

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown backend; choose one of: {', '.join(BACKENDS)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _sandbox_flags(cls, data: Any) -> Any:
        """Flags that are not the run's are the chosen backend's (or another's, checked by its owner)."""
        if isinstance(data, dict) and not isinstance(data.get("sandbox"), BackendSettings):
            given = {k: v for k, v in data.items() if k not in cls.model_fields}
            data = {k: v for k, v in data.items() if k in cls.model_fields}
            backend = data.get("backend", "local")
            if backend in BACKENDS:  # an unknown one is refused by its own validator
                try:
                    data["sandbox"] = sandbox_settings(backend, {**(data.get("sandbox") or {}), **given})
                except KeyError as exc:
                    raise ValueError(f"unknown flag --{exc.args[0]}") from None
        return data

    @model_validator(mode="before")
    @classmethod
    def _local_model_defaults(cls, data: Any) -> Any:
        # a small model on a few cores: few loops, no reasoning (it has none), bounded replies
        if isinstance(data, dict) and data.get("model") == LOCAL_MODEL_NAME:
            data = {**LOCAL_MODEL_DEFAULTS, **data}
        return data

    @model_validator(mode="after")
    def _token_exact(self) -> RunConfig:
        if self.tokens == "exact" and self.uses_local_model and self.token_server != "llamacpp":
            raise ValueError("--model=local is a llama.cpp server: leave --token_server as llamacpp")
        if self.tokens == "exact" and self.vision_model == "main":
            raise ValueError("--vision_model=main shows the model images, and --tokens=exact sends it token ids only: "
                             "use another --vision_model, or --tokens=off")
        if self.tokens == "exact" and self.token_server == "sglang":  # SGLang renders no chat: the runner does
            for name in ("tokenizer_file", "chat_template_file"):
                path = getattr(self, name)
                if not path:
                    raise ValueError(f"--token_server=sglang needs --{name} (the model's own, which the runner renders "
                                     "and tokenises with)")
                if not Path(path).is_file():
                    raise ValueError(f"--{name}={path}: no such file")
        return self

    @model_validator(mode="after")
    def _harness_backend(self) -> RunConfig:
        if self.harness and self.backend not in harness_backends():
            *some, last = harness_backends()
            raise ValueError(f"--agent={self.agent} runs on the {' and '.join([', '.join(some), last])} backends (they "
                             f"hand each sandbox the harness installed on this machine); the {self.backend} backend "
                             "cannot yet")
        return self

    # --- derived -----------------------------------------------------------------------------
    def plugins(self) -> dict[str, Any]:
        """Every toolset this run knows, by name (tools/toolset.py): the registry's, then its MCP
        servers' (each with the tools its start-up listing found: `mcp_listed`)."""
        key = ("plugins", json.dumps(self.mcp_listed, sort_keys=True))
        if key not in self._memo:
            from .tools import McpToolset
            from .tools.mcp import McpError

            try:
                servers = self.mcp_servers()
            except McpError:
                servers = {}  # said at the start, where the servers are read
            listed = self.mcp_listed or {}
            self._memo[key] = {**TOOLSET_REGISTRY, **{name: McpToolset(name, server, listed.get(name))
                                                     for name, server in servers.items() if name not in TOOLSET_REGISTRY}}
        return self._memo[key]

    def mcp_servers(self) -> dict[str, Any]:
        """The run's MCP servers (tools/mcp: McpServer): the distribution's, then --mcp_config's (a name
        in both: --mcp_config's). McpError where --mcp_config cannot be read."""
        from . import distributions
        from .tools.mcp import read_config_file

        out: dict[str, Any] = {}
        if not self.toolsets:
            try:
                out.update(distributions.get(self.distribution).mcp_servers)
            except distributions.DistributionError:
                pass  # said where the distribution is loaded
        if self.mcp_config:
            out.update(read_config_file(self.mcp_config))
        return out

    def always_offered(self) -> list[str]:
        """The run's MCP servers its distribution does not weigh (from --mcp_config): every prompt gets them."""
        if self.toolsets or not self.mcp_config:
            return []
        if "always" not in self._memo:
            from . import distributions
            from .tools.mcp import McpError, read_config_file

            try:
                weighed = set(distributions.get(self.distribution).toolsets)
                self._memo["always"] = [name for name in read_config_file(self.mcp_config) if name not in weighed]
            except (McpError, distributions.DistributionError):
                self._memo["always"] = []
        return list(self._memo["always"])

    def slice(self, settings: type[Any]) -> Any:
        """A component's own settings (one of this run's bases): its fields, nothing else of the run."""
        return settings.model_validate(self.model_dump(include=set(settings.model_fields)))

    @property
    def toolsets_left_out(self) -> dict[str, str]:
        """The distribution's toolsets this run cannot offer, each with what it lacks: drawn, then
        left out (said at the start). `--toolsets` naming one is refused instead."""
        if self.toolsets:
            return {}
        from . import distributions

        try:
            wanted = [t for t, p in distributions.get(self.distribution).toolsets.items() if p > 0]
        except distributions.DistributionError:
            return {}  # reported where the distribution is loaded
        wanted += self.always_offered()
        plugins = self.plugins()
        return {t: why for t in wanted if t in plugins and (why := plugins[t].why_not(self))}

    def offered_toolsets(self) -> list[str]:
        """Every toolset a prompt of this run may be offered (its tool definitions are fingerprinted)."""
        if self.toolsets:
            return list(self.toolsets)
        from . import distributions

        left_out = self.toolsets_left_out
        drawn = [t for t, p in distributions.get(self.distribution).toolsets.items() if p > 0]
        return sorted(t for t in [*drawn, *self.always_offered()] if t not in left_out)

    def tools(self, toolsets: list[str]) -> list[Any]:
        """The tools a prompt offered these toolsets is given, in this run's words (--tool_descriptions);
        browser_vision only with a vision model."""
        from .tools import tools_for

        return tools_for(toolsets, self.tool_description_texts, vision=bool(self.vision_model), plugins=self.plugins())

    def tool_schema(self) -> str:
        """The hash of every tool definition a prompt of this run may be offered (fingerprinted)."""
        from .tools import schema_hash

        return schema_hash(self.offered_toolsets(), self.tool_description_texts, vision=bool(self.vision_model),
                           plugins=self.plugins())

    @property
    def uses_local_model(self) -> bool:
        return self.model == LOCAL_MODEL_NAME

    @property
    def model_label(self) -> str:
        """The model named in records: for the embedded one, which weights file it ran."""
        if not self.uses_local_model:
            return self.model
        return f"local:{Path(self.local_model or DEFAULT_WEIGHTS.filename).stem}"

    def model_settings(self) -> ModelSettings:
        """What the model client is told: its own fields, nothing else of the run."""
        return self.slice(ModelSettings)

    def judge_settings(self) -> ModelSettings:
        """The rubric judge's: the run's endpoint and model unless --judge_* name others; short,
        deterministic replies."""
        return self.model_settings().model_copy(update={
            "model": self.judge_model or self.model, "base_url": self.judge_base_url or self.base_url,
            "temperature": 0.0, "max_tokens": 1024, "tokens": "off"})  # the judge grades in chat, never in ids

    def agent_deadline(self, task: Any) -> float:
        """Seconds the agent may take on this prompt: --prompt_timeout, or the task's own if lower."""
        own = task.agent_timeout * self.timeout_multiplier if task is not None and task.agent_timeout else None
        return min(self.prompt_timeout, own or self.prompt_timeout)

    def step_timeout(self, task: Any) -> float:
        """Seconds a row's setup, or its check, may take: its own check_timeout, else --check_timeout."""
        return task.check_timeout * self.timeout_multiplier if task is not None and task.check_timeout \
            else self.check_timeout

    def toolset_uses(self) -> dict[str, str]:
        """How the run uses each toolset: "offered", "left_out" (drawn, lacking what it needs) or "unused"."""
        offered, left_out = set(self.offered_toolsets()), self.toolsets_left_out
        return {name: "offered" if name in offered else "left_out" if name in left_out else "unused"
                for name in self.plugins()}

    def toolset_keys(self) -> dict[str, str]:
        """The secrets the toolsets a worker opens read from the environment (never stored)."""
        uses = self.toolset_uses()
        return {k: v for name, t in self.plugins().items() if t.wanted(self, uses[name] == "offered")
                for k, v in t.keys(self).items()}

    def judge_api_key(self, run_key: str | None) -> str | None:
        return os.environ.get("JUDGE_API_KEY") or run_key

    def judge(self, run_key: str | None, judge_key: str | None = None) -> Judge:
        """The rubric judge of this run: its settings, and its key (given, JUDGE_API_KEY, or the run's)."""
        return Judge(self.judge_settings(), judge_key or self.judge_api_key(run_key))

    def worker_shares(self, prompts: int) -> list[tuple[int, int]]:
        """(agent loops, live sandboxes) for each worker process: the totals split exactly, so the
        workers together never exceed --concurrency or --max_sandboxes."""
        sandboxes = self.max_sandboxes or self.concurrency
        n = max(1, min(self.num_workers, prompts, self.concurrency, sandboxes))
        return [(_share(self.concurrency, n, i), _share(sandboxes, n, i)) for i in range(n)]

    def resolved_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        return os.environ.get("OPENROUTER_API_KEY") or os.environ.get("OPENAI_API_KEY")

    def stored(self) -> dict[str, Any]:
        """What is written with the run (never a secret), and read back by `--resume`: every flag,
        flat, as a user would give them (the backend's among them)."""
        exclude = {*PER_INVOCATION, "sandbox", "tool_description_texts", "mcp_listed"}  # read again: a change is seen
        if self.uses_local_model:
            exclude.add("base_url")  # the embedded server gets a new port every invocation
        return {**self.model_dump(mode="json", exclude=exclude), **self.sandbox.flags()}

    def fingerprint_fields(self, tool_schema_hash: str) -> dict[str, Any]:
        data = {k: v for k, v in {**self.model_dump(mode="json", include=set(FINGERPRINTED)),
                                  **self.sandbox.flags()}.items() if k in FINGERPRINTED}
        if data.get("first_tool_choice") == "auto":
            data.pop("first_tool_choice")  # the default: runs from before the flag keep their fingerprint
        if not uses_images(self.backend):
            data.pop("image", None)  # a backend that runs no images is not changed by one
        if self.uses_local_model:
            data["local_model"] = self.model_label  # which weights wrote the data
        if self.judge_model:
            data["judge_model"] = self.judge_model  # who graded (only when set: older runs keep theirs)
        if self.tokens != "off":
            data["tokens"] = f"exact:{self.token_server}" if self.tokens == "exact" else self.tokens  # kept, and by whom
        if self.harness_release:
            data["agent"] = self.harness_release  # who drove the prompts (only when not the native loop)
        if self.pass_score != 1.0:
            data["pass_score"] = self.pass_score  # what a pass means (only when set: older runs keep theirs)
        # each toolset's part: who saw, drew, spoke and browsed; what was left out (the rest shows in `tool_schema`)
        plugins = self.plugins()
        for name, use in self.toolset_uses().items():
            data.update(plugins[name].fingerprint(self, use))
        data["tool_schema"] = tool_schema_hash
        return data


def _share(total: int, parts: int, i: int) -> int:
    return total // parts + (1 if i < total % parts else 0)


def fingerprint(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def explain_validation_error(exc: Exception) -> str:
    """Turn a pydantic error into lines naming each flag and what is wrong with it."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    lines = []
    for err in errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            lines.append(f"unknown flag --{loc}")
        elif err.get("type") == "missing":
            lines.append(f"--{loc} is required")
        elif loc:
            lines.append(f"--{loc}={err.get('input')!r}: {msg.removeprefix('Value error, ')}")
        else:
            lines.append(msg.removeprefix("Value error, "))
    return "\n".join(lines)


def run_label(config: RunLocation) -> str:
    """Names this run on shared infrastructure (container labels, sandbox dirs, Flame sessions)."""
    where = hashlib.sha256(str(config.run_dir.resolve()).encode()).hexdigest()[:8]
    safe = re.sub(r"[^a-z0-9-]", "-", config.run_name.lower()).strip("-")[:40] or "run"
    return f"{safe}-{where}"


def flags() -> dict[str, Any]:
    """The run's command-line flags: its own fields with a description, then its slices' (the
    backends declare theirs: `backends.all_flags`)."""
    fields = RunConfig.model_fields
    order = [*RunConfig.__annotations__, *(name for piece in SLICES for name in piece.model_fields)]
    return {name: fields[name] for name in dict.fromkeys(order) if name in fields and fields[name].description}


def is_flag(name: str, backend: str | None = None) -> bool:
    return name in flags() or flag_owner(name, backend) is not None


# --- the flags given, and a resumed run's stored ones ------------------------------------------
def configure(given: dict[str, Any]) -> RunConfig:
    """Validate the flags given; on --resume, what was not given comes from the run's stored settings."""
    from pydantic import ValidationError

    if given.get("model") == LOCAL_MODEL_NAME and "base_url" in given:
        raise ConfigError("--model=local runs the embedded model and takes no --base_url; to use a server of your "
                          "own, name its model (llama.cpp serves any name, e.g. --model=qwen)")
    settings = dict(given)
    if given.get("resume") and "run_name" in given:
        probe = RunConfig.model_construct(**{k: v for k, v in given.items() if k in ("run_name", "output_dir")})
        checkpoint = RunStore(probe.run_dir).read_checkpoint()
        if checkpoint is None and given.get("dataset_file") is None and not RunStore(probe.run_dir).has_outputs():
            raise ConfigError(f"no run named {given['run_name']!r} to resume: {probe.run_dir} holds none (check "
                              "--run_name and --output_dir; give --dataset_file to start a run of that name)")
        stored = (checkpoint or {}).get("config")
        stored = stored if isinstance(stored, dict) else {}  # a checkpoint changed by hand: the flags given
        backend = given.get("backend", stored.get("backend", "local"))
        known = RunConfig.model_fields.keys() | (settings_class(backend).model_fields.keys() if backend in REGISTRY else set())
        # the run's flags and its backend's (an older run stored every backend's flags)
        settings = {k: v for k, v in stored.items() if k not in PER_INVOCATION and k in known}
        if "prefill_messages_file" in given:
            settings.pop("prefill_messages", None)  # re-read the file the user names now
        settings.update(given)
    missing = [name for name in REQUIRED if settings.get(name) is None]
    if missing:
        raise ConfigError("\n".join(f"--{name} is required ({_REQUIRED_WHY[name]})" for name in missing))
    try:
        config = RunConfig(**settings)
    except ValidationError as exc:
        raise ConfigError(explain_validation_error(exc)) from None
    harness = config.harness  # the flags as given (a resumed run stores its default distribution too)
    for name in ("toolsets", "distribution"):
        if harness is not None and harness.own_tools and given.get(name) is not None:
            raise ConfigError(f"--{name} does not apply to --agent={harness.name}: it brings its own tools "
                              f"({harness.own_tools}) and is offered no toolsets; drop --{name}")
    return config


_REQUIRED_WHY = {
    "run_name": "outputs go to <output_dir>/<run_name>/",
    "dataset_file": "a JSONL file with one {\"prompt\": ...} object per line",
}


def same_dataset(given: str, checkpoint: dict[str, Any] | None) -> bool:
    """Whether `given` names the dataset the run holds trajectories of (as its checkpoint names it):
    the same path (as given, or from here), or a file of the same bytes (a dataset moved)."""
    settings = (checkpoint or {}).get("config")
    stored = settings.get("dataset_file") if isinstance(settings, dict) else None
    if not isinstance(stored, str) or given == stored:
        return True  # (a run that stored none cannot say: a checkpoint changed by hand)
    where = (checkpoint or {}).get("dataset_path")  # absolute, from where the run was started
    here = os.path.abspath(given)
    if here in (where, os.path.abspath(stored)):
        return True
    old = Path(where if isinstance(where, str) else stored)
    return Path(given).is_file() and old.is_file() and filecmp.cmp(given, old, shallow=False)


def check_same_dataset(config: RunConfig, checkpoint: dict[str, Any] | None, trajectories: int) -> None:
    """Refuse a resume whose --dataset_file names another dataset than the run's: its prompts would
    join the other's trajectories in one run (README: a resume never mixes two kinds of data)."""
    assert config.dataset_file is not None
    if same_dataset(config.dataset_file, checkpoint):
        return
    stored = (checkpoint or {})["config"]["dataset_file"]
    raise ConfigError(
        f"run {config.run_name!r} holds {trajectories} trajectories of {stored}, and --dataset_file names "
        f"{config.dataset_file}: resuming would mix two datasets in one run. Resume without --dataset_file (the "
        "run's own is used), choose another --run_name for this one, or pass --allow_config_change to add its "
        "prompts to this run anyway.")


def reused_name(config: RunConfig, checkpoint: dict[str, Any] | None, trajectories: int) -> str:
    """Why a run's name cannot be used again without --resume or --overwrite, and what to do: never
    --resume when the dataset given is not the run's (that would mix them)."""
    assert config.dataset_file is not None
    if same_dataset(config.dataset_file, checkpoint):
        return (f"{config.run_dir} already holds a run; pass --resume to continue it (its {trajectories} "
                "trajectories kept), --overwrite to start again from nothing, or choose another --run_name")
    stored = (checkpoint or {})["config"]["dataset_file"]
    return (f"{config.run_dir} already holds a run of another dataset ({trajectories} trajectories of {stored}): "
            f"choose another --run_name for {config.dataset_file}, or --overwrite to start that run again from "
            "nothing (--resume would mix the two datasets in one run, and is refused)")


def check_fingerprint(config: RunConfig, checkpoint: dict[str, Any] | None, record_fps: set[str],
                      tool_schema: str | None = None) -> None:
    """Refuse a resume whose settings would make another kind of data than the run holds (the
    tool definitions too: `tool_schema`, this version's by default)."""
    if tool_schema is None:
        tool_schema = config.tool_schema()
    current = config.fingerprint_fields(tool_schema)
    old_fp = (checkpoint or {}).get("config_fingerprint")
    old_config = (checkpoint or {}).get("config") or {}
    known = {old_fp} if old_fp else set(record_fps)
    accepted = {fingerprint(current)}
    if "image" not in current:  # runs from before backends without images (Flame) stopped fingerprinting one
        accepted.add(fingerprint({**current, "image": config.sandbox.image}))
    if not known or known & accepted:
        return
    old_fields = (checkpoint or {}).get("fingerprinted")  # as the run wrote them (a file it read may have changed since)
    if not isinstance(old_fields, dict):
        try:
            old_fields = RunConfig.model_validate(old_config).fingerprint_fields("?") if isinstance(old_config, dict) else {}
        except (ValueError, TypeError):  # stored settings this version no longer reads
            old_fields = {}
    changed = [
        f"  {k}: {old_fields.get(k)!r} → {v!r}" for k, v in {**dict.fromkeys(old_fields), **current}.items()
        if k != "tool_schema" and old_fields and old_fields.get(k) != v
    ]
    if not changed:
        changed = ["  the tool definitions (hermes-batch was upgraded)"] if old_fields else ["  (settings of the earlier run are unknown)"]
    raise ConfigError(
        "this run was started with different settings, and resuming would mix two kinds of data:\n"
        + "\n".join(changed)
        + "\nResume with the original settings, use another --run_name, or pass --allow_config_change to mix anyway."
    )
