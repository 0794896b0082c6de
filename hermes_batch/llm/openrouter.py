"""OpenRouter's request fields: which providers may serve a request, and reasoning effort in the
router's own form (other endpoints ignore fields they do not know, or never see them: they are
sent only when their flags are given)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..flags import CommaList

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")


class OpenRouterSettings(BaseModel):
    reasoning_effort: Literal[REASONING_EFFORTS] | None = Field(  # type: ignore[valid-type]
        None, description="reasoning: {enabled, effort}: " + ", ".join(REASONING_EFFORTS))
    reasoning_disabled: bool = Field(False, description="reasoning: {effort: none}; wins over --reasoning_effort")
    providers_allowed: CommaList | None = Field(None, description="OpenRouter provider.only (comma list)")
    providers_ignored: CommaList | None = Field(None, description="OpenRouter provider.ignore (comma list)")
    providers_order: CommaList | None = Field(None, description="OpenRouter provider.order (comma list)")
    provider_sort: Literal["price", "throughput", "latency"] | None = Field(None, description="OpenRouter provider.sort")


def request_extras(s: OpenRouterSettings) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    provider = {
        k: v for k, v in (
            ("only", s.providers_allowed), ("ignore", s.providers_ignored),
            ("order", s.providers_order), ("sort", s.provider_sort),
        ) if v
    }
    if provider:
        extras["provider"] = provider
    if s.reasoning_disabled:
        extras["reasoning"] = {"effort": "none"}
    elif s.reasoning_effort:
        extras["reasoning"] = {"enabled": s.reasoning_effort != "none", "effort": s.reasoning_effort}
    return extras
