"""Run configuration: every CLI flag, validated once, plus the fingerprint that guards `--resume`."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .local_model import DEFAULT_WEIGHTS, LOCAL_MODEL_NAME

DEFAULT_MODEL = "anthropic/claude-sonnet-4.6"
DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
# What `--model=local` changes when the flag is not given (README "Embedded model" says why).
LOCAL_MODEL_DEFAULTS = {
    "require_reasoning": False,  # it writes no reasoning: the filter would discard every sample
    "distribution": "offline",  # an offline model, offered no web tools
    "num_workers": 1, "concurrency": 2,  # two llama.cpp slots on a few cores; more loops only queue
    "max_tokens": 1024,  # a 1.5B model can ramble; bounded replies keep a trajectory under a minute or two
    "first_tool_choice": "required",  # left to choose, it describes the work in prose half the time
}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")

# Settings that change what a trajectory looks like: a resume that changes one of them would mix
# two different datasets in one run, so it is refused unless --allow_config_change is given.
FINGERPRINTED = (
    "model", "distribution", "toolsets", "max_turns", "reasoning_effort", "reasoning_disabled",
    "max_tokens", "temperature", "ephemeral_system_prompt", "prefill_messages", "require_reasoning",
    "backend", "image", "command_timeout", "first_tool_choice",
)
# Flags that only steer this one invocation; they are neither stored with the run nor fingerprinted.
PER_INVOCATION = ("resume", "verbose", "api_key", "allow_config_change", "overwrite")


class ConfigError(ValueError):
    """A flag or file the user gave is wrong; the message says which and why."""


def _split_list(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, str):
        items = [s.strip() for s in v.split(",")]
    elif isinstance(v, (list, tuple)):
        items = [str(s).strip() for s in v]
    else:
        return v
    return [s for s in items if s]


class PrefillMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset_file: str | None = None
    run_name: str
    batch_size: int = Field(10, ge=1)
    distribution: str = "default"
    toolsets: list[str] | None = None
    model: str = DEFAULT_MODEL
    base_url: str = DEFAULT_BASE_URL
    api_key: SecretStr | None = None
    max_turns: int = Field(10, ge=1)
    num_workers: int = Field(4, ge=1, le=256)
    concurrency: int = Field(64, ge=1)
    max_sandboxes: int | None = Field(None, ge=1)
    max_samples: int | None = Field(None, ge=1)
    output_dir: str = "data"
    resume: bool = False
    overwrite: bool = False
    allow_config_change: bool = False
    verbose: bool = False
    # model request shaping
    ephemeral_system_prompt: str | None = None
    prefill_messages_file: str | None = None
    prefill_messages: list[PrefillMessage] | None = None
    providers_allowed: list[str] | None = None
    providers_ignored: list[str] | None = None
    providers_order: list[str] | None = None
    provider_sort: Literal["price", "throughput", "latency"] | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    reasoning_effort: Literal[REASONING_EFFORTS] | None = None  # type: ignore[valid-type]
    reasoning_disabled: bool = False
    request_timeout: float = Field(600.0, gt=0)
    max_retries: int = Field(6, ge=0)
    first_tool_choice: Literal["auto", "required"] = "auto"
    prompt_timeout: float = Field(3600.0, gt=0)  # wall-clock seconds one prompt may take, all turns together
    max_cost: float | None = Field(None, gt=0)  # USD for the whole run, from the provider's reported cost
    max_total_tokens: int | None = Field(None, ge=1)  # tokens for the whole run
    max_attempts: int = Field(3, ge=1)  # runs of a prompt that failed before --resume stops retrying it
    # quality filters
    require_reasoning: bool = True
    # sandboxes
    backend: Literal["local", "docker", "modal", "singularity", "flame"] = "local"
    image: str = "python:3.12-slim"
    command_timeout: float = Field(180.0, gt=0, le=3600)
    network: bool = False
    memory: str = "1g"
    cpus: float = Field(1.0, gt=0)
    pids_limit: int = Field(256, ge=16)
    runtime: str | None = None
    sandbox_root: str | None = None
    local_isolation: Literal["bwrap", "none"] = "bwrap"
    keep_flame_sessions: bool = False
    flame_id_scheme: Literal["run", "machine"] = "run"
    web_search_url: str | None = None
    # the embedded model (--model=local)
    local_model: str | None = None
    local_threads: int | None = Field(None, ge=1, le=256)
    local_ctx: int = Field(8192, ge=512)
    local_parallel: int = Field(2, ge=1, le=64)

    @model_validator(mode="before")
    @classmethod
    def _local_model_defaults(cls, data: Any) -> Any:
        # a small model on a few cores: few loops, no reasoning (it has none), bounded replies
        if isinstance(data, dict) and data.get("model") == LOCAL_MODEL_NAME:
            data = {**LOCAL_MODEL_DEFAULTS, **data}
        return data

    @field_validator("toolsets", "providers_allowed", "providers_ignored", "providers_order", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _split_list(v)

    @field_validator(
        "model", "run_name", "distribution", "dataset_file", "base_url", "image", "output_dir", mode="before"
    )
    @classmethod
    def _strings(cls, v: Any) -> Any:
        # python-fire turns `--model=1.5` into a float; a model name is always text
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_' or '-' (it names a directory)")
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"https?://", v):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _load_prefill(self) -> "RunConfig":
        if self.prefill_messages_file and self.prefill_messages is None:
            path = Path(self.prefill_messages_file)
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise ValueError(f"prefill_messages_file not found: {path}") from None
            except json.JSONDecodeError as exc:
                raise ValueError(f"prefill_messages_file {path} is not valid JSON: {exc}") from None
            if not isinstance(data, list):
                raise ValueError(f"prefill_messages_file {path} must hold a JSON array of {{role, content}} objects")
            object.__setattr__(self, "prefill_messages", [PrefillMessage.model_validate(m) for m in data])
        return self

    # --- derived -----------------------------------------------------------------------------
    @property
    def uses_local_model(self) -> bool:
        return self.model == LOCAL_MODEL_NAME

    @property
    def model_label(self) -> str:
        """The model named in records: for the embedded one, which weights file it ran."""
        if not self.uses_local_model:
            return self.model
        return f"local:{Path(self.local_model or DEFAULT_WEIGHTS.filename).stem}"

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

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
        """What is written with the run (never a secret), and read back by `--resume`."""
        exclude = set(PER_INVOCATION)
        if self.uses_local_model:
            exclude.add("base_url")  # the embedded server gets a new port every invocation
        return self.model_dump(mode="json", exclude=exclude)

    def fingerprint_fields(self, tool_schema_hash: str) -> dict[str, Any]:
        data = self.model_dump(mode="json", include=set(FINGERPRINTED))
        if data.get("first_tool_choice") == "auto":
            data.pop("first_tool_choice")  # the default: runs from before the flag keep their fingerprint
        if self.backend == "local":
            data.pop("image", None)  # the local backend ignores images
        if self.uses_local_model:
            data["local_model"] = self.model_label  # which weights wrote the data
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
            lines.append(f"--{loc}={err.get('input')!r}: {msg}")
        else:
            lines.append(msg.removeprefix("Value error, "))
    return "\n".join(lines)


def run_label(config: RunConfig) -> str:
    """Names this run on shared infrastructure (container labels, sandbox dirs, Flame sessions)."""
    where = hashlib.sha256(str(config.run_dir.resolve()).encode()).hexdigest()[:8]
    safe = re.sub(r"[^a-z0-9-]", "-", config.run_name.lower()).strip("-")[:40] or "run"
    return f"{safe}-{where}"


def backend_settings(config: RunConfig):
    from backends import BackendSettings

    return BackendSettings(
        run_label=run_label(config),
        image=config.image,
        network=config.network,
        memory=config.memory,
        cpus=config.cpus,
        pids_limit=config.pids_limit,
        runtime=config.runtime,
        sandbox_root=config.sandbox_root,
        local_isolation=config.local_isolation,
        flame_keep_sessions=config.keep_flame_sessions,
        flame_id_scheme=config.flame_id_scheme,
    )
