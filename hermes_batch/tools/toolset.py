"""A toolset as a plug-in: the unit a distribution samples, and everything it needs.

A toolset declares its tools, its flags (`Settings`, a slice of the run's configuration that the
CLI shows flat), what the run must have to offer it (`why_not`, the one home of that decision),
what it adds to the run's fingerprint, and how a worker opens it (`open`: a provider, a client, a
gate) and closes it. What `open` returns is what its tools find in `ToolContext.toolsets[name]`.
Adding one is a module of `tools/` and a line in the registry (tools/__init__.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from .base import Tool


@dataclass
class Opening:
    """What a worker lends the toolsets it opens."""

    config: Any  # the run's RunConfig (a toolset reads its own slice: `config.slice(Settings)`)
    keys: dict[str, str]  # the secrets toolsets read from the runner's environment (`Toolset.keys`), by name
    api_key: str | None = None  # the run's own key (its endpoint's: a vision model there may use it)
    sandboxes: int = 1  # the worker's share of the live sandboxes
    network: bool = False  # the sandboxes have a way out (--network)
    note: Callable[[str], None] | None = None
    _http: Any = None
    _fetch: Any = None
    _closing: list[Any] = field(default_factory=list)

    @property
    def http(self) -> Any:
        """An httpx client for the providers the user configured (trusted, may be local), shared."""
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(timeout=120, headers={"user-agent": "hermes-batch"})
        return self._http

    @property
    def fetch_http(self) -> Any:
        """An httpx client for URLs the model chose: public addresses only (netguard), shared."""
        if self._fetch is None:
            from .netguard import guarded_client

            self._fetch = guarded_client(timeout=30, headers={"user-agent": "hermes-batch"})
        return self._fetch

    async def close(self) -> None:
        for client in (self._http, self._fetch):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()


class Toolset:
    """The default: tools that need nothing but the sandbox."""

    name: ClassVar[str]
    tools: ClassVar[tuple[Tool, ...]]
    Settings: ClassVar[type[BaseModel] | None] = None  # its flags; a base of RunConfig
    opt_in: ClassVar[bool] = False  # offered only when named (--toolsets), in no distribution's draw

    def why_not(self, config: Any) -> str | None:
        """What this run lacks to offer the toolset (None: nothing)."""
        return None

    def fingerprint(self, config: Any, use: str) -> dict[str, Any]:
        """What the toolset adds to the run's fingerprint. `use`: "offered" (a prompt of the run may
        get it), "left_out" (its distribution draws it, and the run lacks what it needs) or "unused"."""
        return {}

    def at_start(self, config: Any, say: Callable[[str], None]) -> None:
        """Before any model call, where the run offers it: refuse what cannot work (UserError, naming
        the flag and the way out), say what a user should know."""

    def sandbox_settings(self, config: Any) -> dict[str, Any]:
        """What the run's sandboxes need of the backend to run its tools (the browser: its driver)."""
        return {}

    def keys(self, config: Any) -> dict[str, str]:
        """The secrets it reads from the runner's environment, by a name of its own (never stored;
        handed to each worker, which on another machine may not have them)."""
        return {}

    def wanted(self, config: Any, offered: bool) -> bool:
        """Whether a worker opens it (by default: when a prompt may be offered it)."""
        return offered

    async def open(self, opening: Opening) -> Any:
        """What its tools find in `ToolContext.toolsets[name]`, for this worker's life."""
        return None

    async def close(self, handle: Any) -> None:
        pass


async def close_all(opened: dict[str, tuple[Toolset, Any]]) -> None:
    """Close what a worker opened, each whatever the others do."""
    for toolset, handle in opened.values():
        with contextlib.suppress(Exception):
            await toolset.close(handle)
