"""The run's backend, opened one way wherever sandboxes are made (the workers, the start-up
checks, `validate`, `recheck`, the run's close): labelled with the run, given what the offered
toolsets need of it, and with `--network` its sandboxes' one way out (the network guard, served
into each sandbox's own network: backends/egress.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..backends import Backend, load_backend
from ..config import RunConfig, run_label
from ..harness import harness_dir


def open_backend(config: RunConfig) -> Backend:
    update: dict[str, Any] = {"run_label": run_label(config)}
    plugins = config.plugins()
    for name in config.offered_toolsets():  # what a toolset's tools need of the sandboxes (the browser's driver)
        update.update(plugins[name].sandbox_settings(config))
    if config.harness is not None:  # the harness that drives the prompts, installed once: read-only in each
        update["harness_dir"] = harness_dir(config)
    return load_backend(config.backend, config.sandbox.model_copy(update=update))


async def set_up(backend: Backend, config: RunConfig) -> Callable[[], Awaitable[None]]:
    """`backend` set up (its way out first, with --network); what shuts it down."""
    guard = None
    if config.sandbox.network:
        from ..tools.guard_proxy import GuardProxy

        guard = backend.egress = GuardProxy()

    async def shut_down() -> None:
        try:
            await backend.shutdown()
        finally:
            if guard is not None:
                await guard.close()

    try:
        await backend.setup()
    except BaseException:
        await shut_down()
        raise
    return shut_down


@contextlib.asynccontextmanager
async def backend_session(config: RunConfig) -> AsyncIterator[Backend]:
    """The run's backend, set up, for the length of a `with`."""
    backend = open_backend(config)
    shut_down = await set_up(backend, config)
    try:
        yield backend
    finally:
        await shut_down()
