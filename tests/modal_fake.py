"""Modal's SDK surface, as the Modal backend uses it, run on the real Docker engine.

Modal's cloud cannot be reached from here, so the backend is tested at the SDK boundary: every
call the backend makes goes through an object that first binds the arguments against the real
`modal` package's signature (a wrong keyword or a missing `.aio` fails the test), then does the
work in a real container. Semantics follow Modal's: an exec past its `timeout` reports -1.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import types

import docker
import modal as real_modal
import modal.container_process  # noqa: F401  (ContainerProcess.wait's signature)

from hermes_batch.backends.docker import ExecOutput

FAKE_APP_ID = "ap-hermes-batch-fake"


class _Call:
    """A Modal function: calling it blocks (forbidden in async code here); `.aio` is the async form."""

    def __init__(self, real, impl, method: bool = False, generator: bool = False):
        self.sig, self.impl, self.method, self.generator = inspect.signature(real), impl, method, generator
        self.name = real.__qualname__

    def _check(self, args, kwargs):
        self.sig.bind(*((None,) if self.method else ()), *args, **kwargs)  # raises TypeError on misuse

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"{self.name} was called blocking; async code must use .aio")

    def aio(self, *args, **kwargs):
        self._check(args, kwargs)
        return self.impl(*args, **kwargs)  # a coroutine, or an async generator for listings


class FakeModal:
    def __init__(self, engine: docker.DockerClient, authorized: bool = True):
        self.engine = engine
        self.authorized = authorized
        self.exception = real_modal.exception
        self.outbound: list[list[str] | None] = []  # each created sandbox's outbound_cidr_allowlist
        fake = self

        class App:
            app_id = FAKE_APP_ID

            async def _lookup(name, *, create_if_missing=False, **_):
                if not fake.authorized:
                    raise real_modal.exception.AuthError("Token missing")
                return App()

            lookup = _Call(real_modal.App.lookup, _lookup)

        class Image:
            def __init__(self, tag):
                self.tag = tag
                self.build = _Call(real_modal.Image.build, self._build, method=True)

            @staticmethod
            def from_registry(tag, *args, **kwargs):
                inspect.signature(real_modal.Image.from_registry).bind(tag, *args, **kwargs)
                return Image(tag)

            async def _build(self, app=None):
                try:
                    await asyncio.to_thread(fake.engine.images.get, self.tag)
                except docker.errors.ImageNotFound:
                    raise real_modal.exception.RemoteError(f"Image build for {self.tag} failed: pull access denied") from None
                return self

        class Sandbox:
            def __init__(self, container_id):
                self.object_id = container_id
                self.exec = _Call(real_modal.Sandbox.exec, self._exec, method=True)
                self.terminate = _Call(real_modal.Sandbox.terminate, self._terminate, method=True)

            async def _create(*args, app=None, tags=None, image=None, env=None, timeout=300, workdir=None, cpu=None,
                              memory=None, block_network=False, runtime=None, outbound_cidr_allowlist=None, **_):
                fake.outbound.append(None if outbound_cidr_allowlist is None else list(outbound_cidr_allowlist))

                def make():
                    c = fake.engine.containers.create(
                        image.tag, list(args), detach=True, labels=dict(tags or {}), environment=env or {},
                        working_dir=workdir, network_mode="none",  # Modal's network is not this machine's
                        mem_limit=f"{memory}m" if memory else None, nano_cpus=int(cpu * 1e9) if cpu else None)
                    c.start()
                    return c.id

                return Sandbox(await asyncio.to_thread(make))

            create = _Call(real_modal.Sandbox.create, _create)

            async def _list(*, app_id=None, tags=None, **_):
                labels = [f"{k}={v}" for k, v in (tags or {}).items()]
                found = await asyncio.to_thread(fake.engine.api.containers, all=True, filters={"label": labels})
                for c in found:
                    yield Sandbox(c["Id"])

            list = _Call(real_modal.Sandbox.list, _list, generator=True)

            async def _exec(self, *args, timeout=None, workdir=None, env=None, text=True, **_):
                return await _Process.start(fake.engine, self.object_id, list(args), workdir, env, timeout, text)

            async def _terminate(self, *, wait=False):
                try:
                    await asyncio.to_thread(fake.engine.api.remove_container, self.object_id, force=True, v=True)
                except docker.errors.NotFound:
                    pass

        self.App, self.Image, self.Sandbox = App, Image, Sandbox


class _Stream:
    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        return item


class _Process:
    def __init__(self):
        self.stdout, self.stderr = _Stream(), _Stream()
        self.returncode = None
        self.wait = _Call(real_modal.container_process.ContainerProcess.wait, self._wait, method=True)
        self._done = asyncio.Event()

    @classmethod
    async def start(cls, engine, container_id, argv, workdir, env, timeout, text):
        proc = cls()
        loop = asyncio.get_running_loop()
        exec_id = (await asyncio.to_thread(engine.api.exec_create, container_id, argv, workdir=workdir,
                                           environment=env or {}))["Id"]

        def pump():
            stream = ExecOutput.start(engine.api, exec_id)  # the SDK's own stream loses a quick command's output
            deadline = threading.Event()

            def expire():
                deadline.set()
                stream.close()

            timer = threading.Timer(timeout, expire) if timeout else None  # Modal's deadline
            if timer:
                timer.start()
            end: object = None
            try:
                for out, err in stream:
                    for target, data in ((proc.stdout, out), (proc.stderr, err)):
                        if data:
                            loop.call_soon_threadsafe(target.queue.put_nowait, data.decode(errors="replace") if text else data)
            except Exception as exc:  # the deadline's close ends the stream; anything else reaches the reader, as Modal's own
                if not deadline.is_set():
                    end = real_modal.exception.ConnectionError(f"the exec's output stream broke: {exc!r}")
            finally:
                if timer:
                    timer.cancel()
            info = engine.api.exec_inspect(exec_id)
            code = -1 if info.get("Running") else info.get("ExitCode")
            for target in (proc.stdout, proc.stderr):
                loop.call_soon_threadsafe(target.queue.put_nowait, end)
            loop.call_soon_threadsafe(proc._finish, code)

        threading.Thread(target=pump, daemon=True).start()
        return proc

    def _finish(self, code):
        self.returncode = code
        self._done.set()

    async def _wait(self):
        await self._done.wait()
        return self.returncode


def fake_modal_module(engine) -> types.SimpleNamespace:
    fake = FakeModal(engine)
    return types.SimpleNamespace(App=fake.App, Image=fake.Image, Sandbox=fake.Sandbox, exception=real_modal.exception,
                                 fake=fake)


def modal_backend_under_test(request, tmp_path):
    """The conformance suite's Modal entry: the backend's `modal` swapped for the Docker-backed SDK surface."""
    from tests.backend_harness import TEST_IMAGE, BackendUnderTest, docker_status, make_settings, unavailable

    why = docker_status()
    if why:
        unavailable("modal", f"its SDK-boundary tests run on Docker: {why}")
    engine = docker.from_env()
    request.getfixturevalue("monkeypatch").setattr("hermes_batch.backends.modal.modal", fake_modal_module(engine))
    return BackendUnderTest("modal", make_settings(tmp_path), TEST_IMAGE, cleanup=engine.close)
