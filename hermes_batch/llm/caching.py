"""Prompt caching (`--prompt_caching=auto|off`) and what cached tokens cost.

A multi-turn agent resends a growing prefix on every call. OpenAI, DeepSeek, Gemini and llama.cpp
cache it by themselves; Anthropic's models (directly or through OpenRouter) cache only up to
`cache_control` breakpoints. With `auto`, a request to such a model marks the system prompt and the
last three messages that have text (Anthropic takes four breakpoints at most), as Hermes Agent
does; every other request goes out unchanged. Either way the tokens the provider says it served
from its cache (`usage.prompt_tokens_details.cached_tokens`) are recorded per call.
"""

from __future__ import annotations

from typing import Any

EPHEMERAL = {"type": "ephemeral"}
MESSAGE_BREAKPOINTS = 3  # besides the system prompt's


def needs_breakpoints(model: str) -> bool:
    """Anthropic's models, by their OpenRouter prefix or their name."""
    name = model.lower()
    return name.startswith("anthropic/") or "claude" in name


def with_breakpoints(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` whose system prompt and last three messages with text carry a
    breakpoint (on their last text part; a string becomes one part). The originals are untouched:
    the conversation kept for the record never holds the markers."""
    out = list(messages)
    marked = [i for i, m in enumerate(out) if m.get("role") == "system"][:1]
    later = [i for i in range(len(out) - 1, -1, -1) if out[i].get("role") != "system" and _has_text(out[i])]
    for i in marked + later[:MESSAGE_BREAKPOINTS]:
        out[i] = _marked(out[i])
    return out


def _has_text(m: dict[str, Any]) -> bool:
    content = m.get("content")
    if isinstance(content, str):
        return bool(content)
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "text" for p in content)


def _marked(m: dict[str, Any]) -> dict[str, Any]:
    content = m["content"]
    parts: list[dict[str, Any]] = ([{"type": "text", "text": content}] if isinstance(content, str)
                                   else [dict(p) for p in content])
    last = max(i for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "text")
    parts[last] = {**parts[last], "cache_control": EPHEMERAL}
    return {**m, "content": parts}


def read_prices(text: str) -> tuple[float, float, float]:
    """`--token_prices=IN,OUT[,CACHED]`: USD per million input, output and cached input tokens
    (cached: the input price when not given)."""
    try:
        numbers = [float(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        numbers = []
    if len(numbers) not in (2, 3) or any(n < 0 for n in numbers):
        raise ValueError("give USD per million tokens as IN,OUT or IN,OUT,CACHED_IN (e.g. 3,15,0.3)")
    return numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else numbers[0]


def priced(usage: dict[str, Any], prices: tuple[float, float, float]) -> float:
    """What a call cost at `prices`, its cached input at the cached price."""
    cached = int(usage.get("cached_tokens") or 0)
    fresh = max(0, int(usage.get("prompt_tokens") or 0) - cached)
    return (fresh * prices[0] + int(usage.get("completion_tokens") or 0) * prices[1] + cached * prices[2]) / 1e6
