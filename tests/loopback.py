"""An aiohttp app served on 127.0.0.1 from a thread of its own: the base of the HTTP doubles
(tests/media_doubles.py, tests/llamacpp_double.py). A double adds its routes in `routes`."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class LoopbackServer:
    suffix = ""  # what follows host:port in `base_url` (an API's /v1)

    def __init__(self) -> None:
        self.base_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def start(self) -> str:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=64 * 1024 * 1024)
            self.routes(app)
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.base_url = f"http://127.0.0.1:{port}{self.suffix}"
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True, name=type(self).__name__)
        self._thread.start()
        ready.wait(10)
        return self.base_url

    def stop(self) -> None:
        if self._loop is None or self._runner is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
