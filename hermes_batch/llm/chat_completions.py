"""The OpenAI-compatible chat-completions endpoint (OpenRouter, OpenAI, vLLM, SGLang, llama.cpp):
one request with the model's settings, and its retries.

Errors split three ways: retried here (429, 5xx, connection trouble), fatal for the whole run
(a rejected key, no credit, an unknown model: every other prompt would fail the same way), or
fatal for this prompt only (a request the endpoint refuses, retries exhausted).
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import json
import math
import random
import time
import urllib.parse
import urllib.request
import uuid
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from ..tokens import tagged_calls
from ..util import AdaptiveLimit
from . import Completion, FatalRunError, ModelSettings, PromptFailed, openrouter
from .caching import needs_breakpoints, priced, read_prices, with_breakpoints
from .token_client import finite

MAX_RETRY_WAIT = 60.0  # seconds: a server asking for a day is not waited on a day per retry
# --tokens=record asks for these; an endpoint that refuses one by name is asked again without it
TOKEN_FIELDS = {"logprobs": True, "return_token_ids": True}  # return_token_ids: vLLM 0.10.2 and later


def _retry_after(exc: openai.APIStatusError) -> float | None:
    """The server's requested wait, capped and jittered (so waiting prompts do not all return at
    once); None when it named none, or none that parses."""
    headers = exc.response.headers if exc.response is not None else {}
    wait = None
    if ms := headers.get("retry-after-ms"):
        try:
            wait = float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if wait is None and value:
        try:
            wait = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                wait = when.timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                wait = None
    if wait is None or wait != wait:  # absent, unparsable or NaN
        return None
    return min(MAX_RETRY_WAIT, max(0.0, wait)) * (1 + random.random() * 0.2)


def _connection_problem(exc: BaseException) -> tuple[str, str]:
    """('endpoint_unreachable' | 'timeout', the root cause) — transports report a refused
    connection differently (aiohttp's says ConnectTimeout), so look down the cause chain."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 8:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    root = chain[-1]
    refused = any(
        (isinstance(e, OSError) and not isinstance(e, TimeoutError)) or "Cannot connect" in str(e) for e in chain[1:]
    )
    return ("endpoint_unreachable" if refused else "timeout"), f"{type(root).__name__}: {root}"


def _not_an_answer(resp: Any) -> str | None:
    """Why a 200 reply is not an answer, or None. Routers answer 200 with an error body and no
    choices, or finish a choice with "error" when the provider failed mid-way (OpenRouter)."""
    choices = getattr(resp, "choices", None)
    if not choices:
        detail = getattr(resp, "model_extra", None) or {}
        return f"the endpoint returned no choices: {json.dumps(detail)[:500]}"
    choice = choices[0]
    if getattr(choice, "message", None) is None:
        return "the endpoint returned a choice without a message"
    if choice.finish_reason == "error":
        extra = getattr(choice, "model_extra", None) or {}
        detail = extra.get("error") or (getattr(resp, "model_extra", None) or {}).get("error") or ""
        return f"the model's reply ended with an error{': ' + json.dumps(detail)[:500] if detail else ''}"
    return None


def _is_moderation(exc: openai.APIStatusError) -> bool:
    """OpenRouter's refusal of a flagged input: 403 with moderation reasons, not a key problem."""
    try:
        body = exc.response.json()
    except Exception:
        return False
    err = body.get("error", {}) if isinstance(body, dict) else {}
    meta = err.get("metadata") if isinstance(err, dict) else None
    if isinstance(meta, dict) and ("reasons" in meta or "flagged_input" in meta):
        return True
    return "moderation" in str(err.get("message", "") if isinstance(err, dict) else "").lower()


def _refused_token_field(exc: openai.APIStatusError, sent: dict[str, Any]) -> str | None:
    """A field --tokens=record added to the request sent that the endpoint's refusal names (OpenAI's
    API refuses return_token_ids, some models logprobs), or None."""
    said = _describe(exc)
    return next((f for f in TOKEN_FIELDS if f in sent and f in said), None)


def _ids(value: Any) -> list[int] | None:
    return [int(t) for t in value] if isinstance(value, list) and all(isinstance(t, int) for t in value) else None


def _token_data(resp: Any) -> tuple[list[int] | None, list[int] | None, list[float]]:
    """--tokens=record: (the prompt's ids, the reply's ids, a log-probability per reply token) as the
    endpoint returned them: vLLM gives `prompt_token_ids` and a choice's `token_ids`; llama.cpp an
    `id` on each log-probability; hosted endpoints log-probabilities only. None: not given."""
    choice = resp.choices[0]
    extra, choice_extra = resp.model_extra or {}, choice.model_extra or {}
    prompt = _ids(extra.get("prompt_token_ids") or choice_extra.get("prompt_token_ids"))
    entries = list(choice.logprobs.content or []) if choice.logprobs is not None else []
    logprobs = [finite(e.logprob) for e in entries]
    completion = _ids(choice_extra.get("token_ids"))
    if completion is None and entries:
        completion = _ids([(e.model_extra or {}).get("id") for e in entries])
    if completion is not None and len(logprobs) != len(completion):  # aligned only where they can be
        logprobs = logprobs + [math.nan] if len(logprobs) == len(completion) - 1 else [math.nan] * len(completion)
    return prompt, completion, logprobs


def _backoff(attempt: int) -> float:
    return min(60.0, 2 ** attempt) * (0.5 + random.random() / 2)


def _describe(exc: openai.APIStatusError) -> str:
    try:
        body = exc.response.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = err.get("message") if isinstance(err, dict) else str(err)
    except Exception:
        msg = exc.message
    return f"HTTP {exc.status_code}: {msg}"


def _loopback(url: str) -> bool:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _proxy_for(url: str) -> str | None:
    """The proxy a request to `url` goes through (the environment's, NO_PROXY applied); never one
    for a server on this machine's loopback (the embedded model's, say)."""
    if _loopback(url):
        return None
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    return None if proxy is None or urllib.request.proxy_bypass(parts.hostname or "") else proxy


def _via(url: str) -> str:
    proxy = _proxy_for(url)
    return f" through the proxy {proxy}" if proxy else ""


def _http_client(settings: ModelSettings):
    """aiohttp's connection pool: with hundreds of requests in flight, httpx's pool spends more CPU
    checking its connections than sending requests (measured: benchmarks/bench_throughput.py).
    The environment's proxy settings apply, except to a loopback server (the embedded model's,
    a local vLLM): requests to it never leave the machine."""
    trust_env = not _loopback(settings.base_url)
    try:
        return openai.DefaultAioHttpClient(timeout=settings.request_timeout, trust_env=trust_env)
    except Exception:  # aiohttp missing: the SDK's default client works, only slower
        return None if trust_env else openai.DefaultAsyncHttpxClient(timeout=settings.request_timeout, trust_env=False)


class ChatCompletionsClient:
    def __init__(self, settings: ModelSettings, api_key: str | None, limit: AdaptiveLimit):
        self.settings = settings
        self.limit = limit
        self.client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=api_key or "not-set",
            max_retries=0,  # retries are ours: they must see 429s and feed the adaptive limit
            timeout=settings.request_timeout,
            http_client=_http_client(settings),
        )
        self.request_extras = self._request_extras()
        if settings.tokens == "record":
            self.request_extras.update(TOKEN_FIELDS)
        self.breakpoints = settings.prompt_caching == "auto" and needs_breakpoints(settings.model)
        self.prices = read_prices(settings.token_prices) if settings.token_prices else None

    def _request_extras(self) -> dict[str, Any]:
        s = self.settings
        extras: dict[str, Any] = {}
        if s.max_tokens:
            extras["max_tokens"] = s.max_tokens
        if s.temperature is not None:
            extras["temperature"] = s.temperature
        return {**extras, **openrouter.request_extras(s)}

    async def close(self) -> None:
        await self.client.close()

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       tool_choice: str | None = None, seed: int | None = None, trace: Any = None,
                       model: str | None = None) -> Completion:
        failures = 0
        rate_limited = 0
        while True:
            started = time.monotonic()
            sent = with_breakpoints(messages) if self.breakpoints else messages
            body: dict[str, Any] = {"model": model or self.settings.model, "messages": sent, **self.request_extras}
            if tools:
                body["tools"] = tools
                if tool_choice:
                    body["tool_choice"] = tool_choice
            if seed is not None:  # one sample of several: its own draw where the endpoint takes a seed
                body["seed"] = seed
            try:
                async with self.limit:
                    # the SDK's own request path, without `create`'s walk over every message to
                    # transform typed params (a tenth of a worker's CPU; the body is plain JSON already)
                    resp = await self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)
            except openai.RateLimitError as exc:
                rate_limited += 1
                self.limit.rate_limited()
                if rate_limited > max(20, self.settings.max_retries):
                    raise PromptFailed("rate_limited", f"still rate limited after {rate_limited} tries: {_describe(exc)}") from exc
                await asyncio.sleep(_retry_after(exc) or _backoff(min(rate_limited, 6)))
                continue
            except openai.APIStatusError as exc:
                self._raise_if_fatal(exc)
                if exc.status_code == 400 and (refused := _refused_token_field(exc, body)):
                    # for the rest of the run (other prompts may have sent it too): token data is what the endpoint gives
                    self.request_extras.pop(refused, None)
                    continue
                if exc.status_code < 500 and exc.status_code not in (408, 409):
                    raise PromptFailed("bad_request", f"the endpoint refused the request: {_describe(exc)}") from exc
                failures += 1
                if failures > self.settings.max_retries:
                    raise PromptFailed("server_error", f"{_describe(exc)} (after {failures} tries)") from exc
                await asyncio.sleep(_retry_after(exc) or _backoff(failures))
                continue
            except (json.JSONDecodeError, openai.APIResponseValidationError) as exc:
                failures += 1  # a reply cut off or garbled on the way (a proxy, a crashed server): ask again
                if failures > self.settings.max_retries:
                    raise PromptFailed("bad_response", f"the endpoint's reply was not valid JSON: {exc} "
                                                       f"(after {failures} tries)") from exc
                await asyncio.sleep(_backoff(failures))
                continue
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                failures += 1
                if failures > self.settings.max_retries:
                    kind, detail = _connection_problem(exc)
                    raise PromptFailed(kind, f"cannot reach {self.settings.base_url}{_via(self.settings.base_url)}: {detail} "
                                             f"(after {failures} tries)") from exc
                await asyncio.sleep(_backoff(failures))
                continue
            not_an_answer = _not_an_answer(resp)
            if not_an_answer:
                failures += 1
                if failures > self.settings.max_retries:
                    raise PromptFailed("model_error", f"{not_an_answer} (after {failures} tries)")
                await asyncio.sleep(_backoff(failures))
                continue
            self.limit.succeeded()
            completion = self._parse(resp, time.monotonic() - started)
            if trace is not None and self.settings.tokens == "record":
                trace.record(*_token_data(resp), completion.finish_reason)
            return completion


    def _raise_if_fatal(self, exc: openai.APIStatusError) -> None:
        where = self.settings.base_url
        if exc.status_code == 401:
            raise FatalRunError(f"the endpoint {where} rejected the API key ({_describe(exc)}); check --api_key, OPENROUTER_API_KEY or OPENAI_API_KEY") from exc
        if exc.status_code == 402:
            raise FatalRunError(f"the endpoint {where} wants payment ({_describe(exc)}); add credit and rerun with --resume") from exc
        if exc.status_code == 403:
            if _is_moderation(exc):  # this input was flagged: the key is fine, other prompts are not affected
                raise PromptFailed("moderation", f"the endpoint's moderation refused this input ({_describe(exc)})") from exc
            raise FatalRunError(f"the endpoint {where} refused access ({_describe(exc)})") from exc
        if exc.status_code == 404:
            raise FatalRunError(f"model {self.settings.model!r} or the API path was not found at {where} ({_describe(exc)}); check --model and --base_url") from exc

    @staticmethod
    async def check(settings: ModelSettings, api_key: str | None) -> str | None:
        """A quick pre-flight: a dead endpoint or a rejected key stops the run before any work starts.

        Returns a warning for problems that are not conclusive (some servers lack /models).
        """
        client = openai.AsyncOpenAI(base_url=settings.base_url, api_key=api_key or "not-set", max_retries=1, timeout=20,
                                    http_client=_http_client(settings))
        try:
            await client.models.list()
        except openai.AuthenticationError as exc:
            raise FatalRunError(f"the endpoint {settings.base_url} rejected the API key ({_describe(exc)}); check --api_key, OPENROUTER_API_KEY or OPENAI_API_KEY") from exc
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            _, detail = _connection_problem(exc)
            raise FatalRunError(f"cannot reach the model endpoint {settings.base_url}{_via(settings.base_url)} ({detail}); "
                                "check --base_url and that the server is running") from exc
        except openai.APIStatusError as exc:
            return f"note: {settings.base_url}/models answered {_describe(exc)}; going on"
        finally:
            await client.close()
        return None

    def _parse(self, resp: Any, latency: float) -> Completion:
        choice = resp.choices[0]
        msg = choice.message
        extra = getattr(msg, "model_extra", None) or {}
        reasoning = getattr(msg, "reasoning", None) or extra.get("reasoning") or extra.get("reasoning_content")
        details = extra.get("reasoning_details")
        details = details if isinstance(details, list) and details else None
        if not reasoning and details:  # some providers give the thoughts only as details
            reasoning = "\n".join(str(d.get("text") or d.get("summary") or "") for d in details
                                  if isinstance(d, dict)).strip() or None
        content = msg.content or ""
        calls = [
            {
                "id": tc.id or f"call_{uuid.uuid4().hex[:24]}",
                "name": tc.function.name,
                "arguments": tc.function.arguments or "",
            }
            for tc in (msg.tool_calls or [])
            if getattr(tc, "function", None) is not None
        ]
        if not calls and "<tool_call>" in content:
            content, calls = tagged_calls(content)
        usage: dict[str, Any] = {}
        if resp.usage is not None:
            usage = {
                "prompt_tokens": resp.usage.prompt_tokens or 0,
                "completion_tokens": resp.usage.completion_tokens or 0,
                "total_tokens": resp.usage.total_tokens or 0,
            }
            cached = getattr(getattr(resp.usage, "prompt_tokens_details", None), "cached_tokens", None)
            if isinstance(cached, int):
                usage["cached_tokens"] = cached
            cost = (getattr(resp.usage, "model_extra", None) or {}).get("cost")
            if isinstance(cost, (int, float)):
                usage["cost"] = float(cost)
            elif self.prices:  # the endpoint says nothing of cost: --token_prices does
                usage["cost"] = priced(usage, self.prices)
        return Completion(
            content=content,
            reasoning=reasoning if isinstance(reasoning, str) and reasoning.strip() else None,
            tool_calls=calls,
            finish_reason=choice.finish_reason,
            usage=usage,
            reasoning_details=details,
            latency=latency,
        )
