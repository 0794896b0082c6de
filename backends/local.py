"""Local backend: each prompt gets its own directory on this host and runs commands as subprocesses.

This gives a private work directory and a scrubbed environment (no runner secrets), not
isolation: code can still read what the host user can. Use `--backend=docker` for untrusted work.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from .base import BackendSettings, ExecResult, SandboxSpec, ShellSandbox, kill_group, run_process

# Variables a command may see; everything else of the runner's environment (API keys!) stays out.
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
_PIPE_DRAIN_AFTER_EXIT = 1.0  # a background job may hold stdout open; stop waiting for it after this


def sandbox_root(settings: BackendSettings) -> Path:
    base = Path(settings.sandbox_root or os.path.join(tempfile.gettempdir(), "hermes-batch"))
    # one directory per run, so the orphan sweep of one run never touches another's sandboxes
    return base / settings.run_label


class LocalSandbox(ShellSandbox):
    def __init__(self, root: Path, settings: BackendSettings):
        self.root = root
        self.workdir = os.path.realpath(root / "work")
        self.scratch = os.path.realpath(root / "tmp")
        self.output_limit = settings.output_limit
        self.session_parallelism = settings.session_parallelism
        self.shell = "bash" if shutil.which("bash") else "sh"
        self._groups: set[int] = set()
        self._closed = False
        site = os.path.join(self.scratch, "site-packages")
        self.env = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
        self.env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        self.env.update(
            HOME=self.workdir, TMPDIR=self.scratch, PYTHONUNBUFFERED="1",
            PIP_TARGET=site, PYTHONPATH=site, PIP_DISABLE_PIP_VERSION_CHECK="1",
        )

    async def exec(self, code, *, language="shell", timeout, cwd=None, env=None, output_limit=None) -> ExecResult:
        if self._closed:
            raise RuntimeError("sandbox is closed")
        argv = await self._code_argv(code, language, self.shell)
        # the group outlives the command when it leaves background jobs: killed at close
        return await run_process(argv, cwd=cwd or self.workdir, env={**self.env, **(env or {})}, timeout=timeout,
                                 limit=output_limit or self.output_limit, on_start=self._groups.add,
                                 drain_after_exit=_PIPE_DRAIN_AFTER_EXIT)

    async def resolve(self, path: str) -> str:
        return os.path.realpath(path)

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        def read() -> bytes:
            with open(path, "rb") as f:
                return f.read(max_bytes)

        return await asyncio.to_thread(read)

    async def write_file(self, path: str, data: bytes) -> None:
        def write() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.hb-tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)

        await asyncio.to_thread(write)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in self._groups:
            kill_group(pgid)
        await asyncio.to_thread(shutil.rmtree, self.root, True)


class LocalBackend:
    name = "local"

    def __init__(self, settings: BackendSettings):
        self.settings = settings
        self.root = sandbox_root(settings)

    async def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    async def prepare_image(self, image: str | None) -> str | None:
        return None  # the local backend runs on the host; per-prompt images do not apply

    async def start(self, spec: SandboxSpec) -> LocalSandbox:
        name = f"{hashlib.sha1(spec.prompt_id.encode()).hexdigest()[:12]}-{secrets.token_hex(3)}"
        root = self.root / name
        for sub in ("work", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return LocalSandbox(root, self.settings)

    async def sweep_orphans(self) -> int:
        """Remove sandboxes that an earlier, crashed run with this label left behind."""
        if not self.root.is_dir():
            return 0
        leftovers = [p for p in self.root.iterdir() if p.is_dir()]
        for p in leftovers:
            shutil.rmtree(p, ignore_errors=True)
        return len(leftovers)

    async def finish_run(self) -> None:
        pass  # nothing shared outlives the prompts' own sandboxes

    async def shutdown(self) -> None:
        pass
