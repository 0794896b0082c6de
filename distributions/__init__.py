"""Toolset distributions: one TOML file per distribution in this folder.

A distribution gives each toolset an independent probability (in percent) of being offered to a
prompt. A path to a `.toml` file of the same shape works wherever a distribution name does. It may
declare MCP servers (`[mcp_servers.<name>]`, as an MCP client's entry: command, args, env | url,
headers): each is a toolset named after it, offered always unless `[toolsets]` gives it a weight.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ..tools.mcp.servers import McpError, McpServer, read_servers

HERE = Path(__file__).parent


class DistributionError(ValueError):
    pass


class Distribution(BaseModel):
    name: str
    description: str = ""
    reference: bool = False  # the reference (hermes-agent 0.19.0) ships it, by this name and with these percentages
    toolsets: dict[str, float] = Field(min_length=1)
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _servers(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mcp_servers") is not None:
            try:
                servers = read_servers(data["mcp_servers"], f"distribution {data.get('name')!r}")
            except McpError as exc:
                raise ValueError(str(exc)) from None
            # a server the [toolsets] table does not weigh is offered to every prompt
            data = {**data, "mcp_servers": servers,
                    "toolsets": {**{name: 100.0 for name in servers}, **(data.get("toolsets") or {})}}
        return data

    @field_validator("toolsets")
    @classmethod
    def _percentages(cls, v: dict[str, float]) -> dict[str, float]:
        for toolset, p in v.items():
            if not 0 <= p <= 100:
                raise ValueError(f"probability of {toolset!r} must be a percentage in [0, 100], got {p}")
        if not any(p > 0 for p in v.values()):
            raise ValueError("at least one toolset needs a probability above 0")
        return v


def _load_file(path: Path, name: str) -> Distribution:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return Distribution(name=name, **data)
    except (tomllib.TOMLDecodeError, ValidationError, TypeError) as exc:
        raise DistributionError(f"distribution file {path} is invalid: {exc}") from exc


def available() -> dict[str, Distribution]:
    """Every distribution shipped in this folder, by name."""
    return {p.stem: _load_file(p, p.stem) for p in sorted(HERE.glob("*.toml"))}


def get(name_or_path: str, known_toolsets: set[str] | None = None) -> Distribution:
    """Look a distribution up by name, or load it from a .toml path; check its toolsets exist."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") and path.is_file():
        dist = _load_file(path, path.stem)
    else:
        shipped = available()
        if name_or_path not in shipped:
            raise DistributionError(
                f"unknown distribution {name_or_path!r}; available: {', '.join(shipped)} "
                "(or give a path to a .toml file; see --list_distributions)"
            )
        dist = shipped[name_or_path]
    if known_toolsets is not None:
        unknown = sorted(set(dist.toolsets) - known_toolsets)
        if unknown:
            raise DistributionError(
                f"distribution {dist.name!r} names unknown toolset(s) {', '.join(unknown)}; "
                f"known toolsets: {', '.join(sorted(known_toolsets))}"
            )
    return dist
