"""The model clients: one protocol, one file per kind of endpoint, picked by `ModelSettings.api`.

A client takes the model's own settings (never the whole run's), runs one request at a time with
its retries, and raises `PromptFailed` (this prompt cannot finish now) or `FatalRunError` (no prompt
can: a rejected key, no credit). A second protocol (the Responses API, Anthropic's Messages API)
is one new file and one line in `CLIENTS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import field_validator

from ..errors import UserError
from ..flags import Text, flag
from ..util import AdaptiveLimit
from .caching import read_prices
from .openrouter import OpenRouterSettings

DEFAULT_MODEL = "anthropic/claude-sonnet-4.6"
DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"

# endpoint kind → "module:Class" in this package
CLIENTS = {"chat_completions": "chat_completions:ChatCompletionsClient", "llamacpp": "llamacpp:LlamaCppClient",
           "vllm": "vllm:VLLMClient", "sglang": "sglang:SGLangClient"}


class ModelSettings(OpenRouterSettings):
    """What a model client is told: its flags."""

    model: Text = flag(DEFAULT_MODEL, "model name sent to the endpoint; `local` runs the embedded model")
    base_url: Text = flag(DEFAULT_BASE_URL, "OpenAI-compatible endpoint")
    max_tokens: int | None = flag(None, "max_tokens per request", ge=1)
    temperature: float | None = flag(None, "sampling temperature", ge=0, le=2)
    request_timeout: float = flag(600.0, "seconds per model request", gt=0)
    max_retries: int = flag(6, "retries of a request after 5xx or connection errors", ge=0)
    prompt_caching: Literal["auto", "off"] = flag(
        "auto", "auto: cache breakpoints on the requests of models that need them (Anthropic's); off: none")
    token_prices: str | None = flag(None, "USD per million input, output [and cached input] tokens, e.g. 3,15,0.3: "
                                          "the cost of a reply whose endpoint reports none (then --max_cost holds)")

    @field_validator("token_prices", mode="before")
    @classmethod
    def _prices(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):  # fire reads 3,15,0.3 as a tuple
            v = ",".join(str(x) for x in v)
        if v is not None:
            read_prices(str(v))
        return v
    tokens: Literal["off", "record", "exact"] = flag(
        "off", "exact: the runner renders and tokenises each request itself, sends token ids and keeps the ids "
               "and log-probabilities the model returned (llama.cpp's own server: the embedded model, or yours at "
               "--base_url; or vLLM: --token_server); record: chat as usual, keeping the ids and log-probabilities "
               "the endpoint returns with each reply, and counting where a prompt does not extend the last; off: chat")
    token_server: Literal["llamacpp", "vllm", "sglang"] = flag(
        "llamacpp", "with --tokens=exact: the server's kind, whose own endpoints render, tokenise and generate "
                    "(llamacpp: /apply-template, /tokenize, /completion; vllm: /tokenize, /v1/completions; sglang: "
                    "/generate, the runner rendering with --chat_template_file and --tokenizer_file)")
    tokenizer_file: str | None = flag(None, "with --token_server=sglang: the model's tokenizer.json")
    chat_template_file: str | None = flag(
        None, "with --token_server=sglang: the model's chat template (a .jinja file, or its tokenizer_config.json)")
    api: Literal["chat_completions"] = "chat_completions"  # the kind of endpoint (CLIENTS)


class FatalRunError(UserError):
    """Stops the whole run: continuing would burn the dataset on an error that affects every prompt."""


class PromptFailed(RuntimeError):
    """This prompt cannot finish now; it is recorded as failed and retried by `--resume`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.calls: list[dict[str, Any]] = []  # the prompt's model calls before it failed (their usage)


@dataclass
class Completion:
    content: str
    reasoning: str | None
    tool_calls: list[dict[str, str]]  # {id, name, arguments (JSON text)}
    finish_reason: str | None
    usage: dict[str, Any] = field(default_factory=dict)
    reasoning_details: list[dict[str, Any]] | None = None  # signed/encrypted thoughts to send back next turn
    latency: float = 0.0


class ModelClient(Protocol):
    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       tool_choice: str | None = None, seed: int | None = None, trace: Any = None,
                       model: str | None = None) -> Completion:
        """`trace`: the rollout's tokens.TokenTrace, which a token-level client reads and extends;
        `model`: a served model other than the run's to ask (a trainer's policy version, e.g. an adapter)."""
        ...

    async def close(self) -> None: ...


def _client_class(settings: ModelSettings) -> Any:
    module, cls = CLIENTS[settings.token_server if settings.tokens == "exact" else settings.api].split(":")  # record: chat
    return getattr(importlib.import_module(f".{module}", __package__), cls)


def open_client(settings: ModelSettings, api_key: str | None, limit: AdaptiveLimit) -> ModelClient:
    client: ModelClient = _client_class(settings)(settings, api_key, limit)
    return client


async def check_endpoint(settings: ModelSettings, api_key: str | None) -> str | None:
    """Before any work: raises FatalRunError for a dead endpoint or a rejected key; a warning for
    what is not conclusive."""
    warning: str | None = await _client_class(settings).check(settings, api_key)
    return warning


__all__ = ["CLIENTS", "Completion", "FatalRunError", "ModelClient", "ModelSettings", "PromptFailed", "check_endpoint",
           "open_client"]
