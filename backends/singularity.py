"""Singularity / Apptainer backend: one container instance per prompt, commands run with `exec`.

- The instance starts with `--containall --cleanenv --no-home`, a network of its own
  (`--net --network none`; with `--network` its one way out is the runner's network guard, placed
  on its loopback: egress.py), `--memory`/`--cpus` limits, and, when the runner is root,
  `--no-privs` (root in the instance holds no capability, whatever apptainer.conf says).
  The image is read-only (no overlay): host directories of its own give it a writable
  `/workspace`, `/tmp` and `/logs`, on a filesystem of `--disk` bytes when the runner is root
  (disk.py); a row's `cwd` is used in place of `/workspace`, the image's files there copied into
  it first. They are bound once, at the instance's start, from a directory of the runner's that
  the instance never sees. The browser driver and the agent harness (`--agent`), when the run has
  them, are bound read-only inside its `/tmp` (the read-only image has no mount point for them).
- Images: a `.sif` file or sandbox directory is used as it is; a registry reference
  (`python:3.12-slim`, `docker://...`, `oras://...`) is built once into a SIF in the image cache
  before any model call, and a prompt whose image cannot be built fails at once.
- Before a check, `end_processes` stops the instance's init from the host (it runs as the
  commands' user, who could have rewritten its memory), then ends every other process.
- Environment variables reach commands as arguments the trusted shell exports, under
  `--cleanenv`, so nothing of the runner's own environment (API keys) is inherited, and no value is
  expanded on the way (apptainer evaluates `APPTAINERENV_*` values).
- Instances are named `hb-<run key>-...`, so `sweep_orphans` can stop what a crashed run left.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from .base import (
    CONTAINER_WORKDIR,
    KILL_GRACE,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    ImageUnavailable,
    Language,
    OncePerKey,
    Process,
    SandboxError,
    SandboxSpec,
    ShellSandbox,
    kill_group,
    killed_by_timeout,
    run_process,
    spawn_process,
)
from .disk import HostDirectories, SandboxRootSettings, remove_tree
from .egress import egress_env, listener_inside

BUILD_TIMEOUT = 600.0
# the host's device nodes --containall binds into an instance (its "minimal" /dev)
HOST_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/tty")


def apptainer_command() -> str:
    """`HERMES_BATCH_APPTAINER`, else `apptainer`, else `singularity` on PATH."""
    chosen = os.environ.get("HERMES_BATCH_APPTAINER") or shutil.which("apptainer") or shutil.which("singularity")
    if not chosen:
        raise SandboxError("neither apptainer nor singularity is on PATH (or set HERMES_BATCH_APPTAINER)")
    return chosen


def _host_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8"}


# `sh -c` with `K=V ... -- argv`: each assignment exported as it is (no expansion), then argv run
_EXPORT_THEN_EXEC = 'while [ "$1" != -- ]; do export "$1"; shift; done; shift; exec "$@"'


# The browser driver's and the agent harness's mount points: Apptainer cannot make one in a
# read-only image without an overlay, so they go in the prompt's /tmp (made before the instance
# starts, bound read-only)
DRIVER_IN_TMP = ".hermes-batch-browser"
HARNESS_IN_TMP = ".hermes-batch-harness-release"


class SingularitySandbox(ShellSandbox):
    own_pid_namespace = True  # --containall; the instance's init is PID 1
    own_root = True
    # the host directories bound in (the work directory is one too); the image itself is read-only
    agent_writable: tuple[str, ...] | None = ("/tmp", "/var/tmp", "/logs", "/dev/shm")

    def __init__(self, backend: SingularityBackend, name: str, host_root: Path, workdir: str):
        self.backend = backend
        self.name = name
        self.host_root = host_root
        self.workdir = workdir
        self.scratch = "/tmp/.hermes-batch"
        self.driver_dir = f"/tmp/{DRIVER_IN_TMP}" if backend.settings.driver_dir else None
        self.harness_dir = f"/tmp/{HARNESS_IN_TMP}" if backend.settings.harness_dir else None
        self.output_limit = backend.settings.output_limit
        self.session_parallelism = backend.settings.session_parallelism
        self._groups: set[int] = set()
        self.egress_stop: Callable[[], Awaitable[None]] | None = None  # --network: ends its way out

    async def exec(self, code: str, *, language: Language = "shell", timeout: float, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_limit: int | None = None,
                   runner: bool = False) -> ExecResult:
        self.check_open()
        argv = await self._timed_argv(code, language, timeout)
        # as arguments the trusted shell exports, not APPTAINERENV_*, whose values apptainer expands
        # (a model's `$i`, quotes and backquotes would be evaluated before its command ran)
        assigns = [f"{k}={v}" for k, v in self.command_env(env, runner).items()]
        cmd = [self.backend.apptainer, "-q", "exec", "--cleanenv", "--pwd", cwd or self.workdir,
               f"instance://{self.name}", self.shell, "-c", _EXPORT_THEN_EXEC, "sh", *assigns, "--", *argv]
        res = await run_process(cmd, cwd=None, env=_host_env(),
                                timeout=timeout + KILL_GRACE + 3, limit=output_limit or self.output_limit,
                                on_start=self._groups.add)
        if res.exit_code == 255 and "instance" in res.stderr and "no instance found" in res.stderr:
            raise SandboxError(f"instance {self.name} is gone: {res.stderr.strip()}")
        if killed_by_timeout(res.exit_code, res.duration, timeout):
            res.exit_code, res.timed_out = TIMEOUT_EXIT_CODE, True
        return res

    async def spawn(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        self.check_open()
        assigns = [f"{k}={v}" for k, v in self.command_env(env, False).items()]
        cmd = [self.backend.apptainer, "-q", "exec", "--cleanenv", "--pwd", cwd or self.workdir,
               f"instance://{self.name}", self.shell, "-c", _EXPORT_THEN_EXEC, "sh", *assigns, "--", *argv]
        return await spawn_process(cmd, cwd=None, env=_host_env(), on_start=self._groups.add)

    async def network_pid(self) -> int | None:
        return await self.backend.init_pid(self.name)

    async def end_processes(self) -> None:
        # the instance's init (PID 1, spared by the end of the rest) runs as the commands' user, who
        # may have rewritten its memory: it is stopped from the host first, for the sandbox's life
        await self.backend.stop_init(self.name)
        self.backend.restore_devices()
        await super().end_processes()

    async def close(self) -> None:
        if not self.mark_closed():
            return
        stop, self.egress_stop = self.egress_stop, None
        if stop is not None:
            await stop()
        for pgid in self._groups:
            kill_group(pgid)
        await self.backend.stop_instance(self.name)
        self.backend.restore_devices()
        await asyncio.to_thread(self.backend.remove, self.host_root)


class SingularityBackend(HostDirectories):
    name = "singularity"
    uses_images = True
    Settings = SandboxRootSettings
    settings: SandboxRootSettings

    def __init__(self, settings: SandboxRootSettings):
        super().__init__(settings)
        self.run_key = settings.run_key
        cache = os.environ.get("HERMES_BATCH_APPTAINER_CACHE", "/var/tmp/hermes-batch-apptainer")
        self.image_cache = Path(cache)
        self._builds = OncePerKey()
        self.apptainer = "apptainer"  # the command found at setup()
        self.device_modes: dict[str, int] = {}  # as root: the host's device nodes' modes at the start

    async def _run(self, *args: str, timeout: float = 120.0) -> ExecResult:
        return await run_process([self.apptainer, *args], cwd=None, env=_host_env(), timeout=timeout, limit=256 * 1024)

    async def setup(self) -> None:
        self.apptainer = apptainer_command()
        res = await self._run("--version", timeout=30)
        if res.exit_code != 0:
            raise SandboxError(f"{self.apptainer} does not run: {res.stderr.strip() or res.stdout.strip()}")
        await self.prepare_directories()
        if os.geteuid() == 0:
            self.device_modes = {d: os.stat(d).st_mode & 0o7777 for d in HOST_DEVICES if os.path.exists(d)}
            self.notes.append("warning: as root, Apptainer runs the prompt's commands as uid 0 (no capabilities): they can "
                              f"change the mode of the host's device nodes bound into the instance ({', '.join(HOST_DEVICES)}); "
                              "the runner sets them back before each check and at each prompt's end; run as another user "
                              "to rule it out")

    def restore_devices(self) -> None:
        """The host's device nodes as they were at the start (the agent, uid 0, may have chmod-ed them)."""
        for device, mode in self.device_modes.items():
            try:
                if os.stat(device).st_mode & 0o7777 != mode:
                    os.chmod(device, mode)
            except OSError:
                pass

    def remove(self, host: Path) -> None:
        self.disks.release(host)


    def local_image(self, image: str | None) -> tuple[str, bool]:
        """(the path the instance starts from, whether it is a registry reference to build first)."""
        image = image or self.settings.image
        if image.startswith(("/", "./", "../")) or image.endswith(".sif"):
            return image, False
        ref = image if re.match(r"^[a-z-]+://", image) else f"docker://{image}"
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", ref.split("://", 1)[1])
        return str(self.image_cache / f"{safe}-{hashlib.sha256(ref.encode()).hexdigest()[:8]}.sif"), True

    def _visible(self, source_dir: str) -> str:
        """A directory of the runner's where Apptainer surely sees it: beside the images (an
        Apptainer run in a wrapper may see only /tmp and /var/tmp of this machine), made once, its
        files hard links where the filesystem allows (the harness is hundreds of MB), else copies."""
        source = Path(source_dir)
        target = self.image_cache / source.name
        if not target.is_dir():
            self.image_cache.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=self.image_cache))
            shutil.copytree(source, staging, symlinks=True, dirs_exist_ok=True, copy_function=_link_or_copy)
            staging.chmod(0o755)
            try:
                staging.rename(target)
            except OSError:  # another worker made it first
                shutil.rmtree(staging, ignore_errors=True)
        return str(target)

    async def prepare_image(self, image: str | None) -> str:
        path, build = self.local_image(image)
        await self._builds(path, lambda: self._ensure(image or self.settings.image, path, build))
        return path

    async def _ensure(self, image: str, path: str, build: bool) -> None:
        if os.path.exists(path):
            return
        if not build:
            raise ImageUnavailable(f"image {image} does not exist")
        ref = image if re.match(r"^[a-z-]+://", image) else f"docker://{image}"
        self.image_cache.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.building-{secrets.token_hex(3)}"
        res = await self._run("build", "--force", tmp, ref, timeout=BUILD_TIMEOUT)
        if res.exit_code != 0:
            Path(tmp).unlink(missing_ok=True)
            detail = (res.stderr.strip().splitlines() or ["?"])[-1]
            raise ImageUnavailable(f"image {image} could not be built into a SIF: {detail}")
        os.replace(tmp, path)

    async def start(self, spec: SandboxSpec) -> SingularitySandbox:
        path, _ = self.local_image(spec.image)
        if not os.path.exists(path):
            raise ImageUnavailable(f"image {spec.image or self.settings.image} is not available at {path}")
        name = f"hb-{self.run_key}-{hashlib.sha256(spec.prompt_id.encode()).hexdigest()[:10]}-{secrets.token_hex(2)}"
        host = self.root / name
        os.mkdir(host, 0o700)
        try:
            self.disks.make(host, os.geteuid())
        except OSError as exc:
            os.rmdir(host)
            raise SandboxError(f"cannot make the prompt's directory: {exc}") from exc
        workdir = spec.cwd or CONTAINER_WORKDIR
        s = self.settings
        try:
            os.mkdir(host / "logs")  # Harbor's /logs/verifier: the image is read-only
            if s.driver_dir:  # a mount point for the browser driver where the read-only image has none
                os.mkdir(host / "tmp" / DRIVER_IN_TMP)
            if s.harness_dir:  # and one for the agent harness the run drives (--agent)
                os.mkdir(host / "tmp" / HARNESS_IN_TMP)
            if spec.cwd:  # the image's files there come along into the writable work directory
                await self._copy_out(path, spec.cwd, host / "work")
        except (OSError, SandboxError) as exc:
            self.remove(host)
            raise SandboxError(f"cannot make the prompt's directory: {exc}") from exc
        # No writable overlay: the image (/usr, /etc, ...) stays read-only to the prompt's commands,
        # which run as root when the runner is; only these host directories are writable
        args = ["instance", "start", "--containall", "--cleanenv", "--no-home",
                *(["--no-privs"] if os.geteuid() == 0 else []),
                "--bind", f"{host / 'tmp'}:/tmp", "--bind", f"{host / 'tmp'}:/var/tmp", "--bind", f"{host / 'work'}:{workdir}",
                "--bind", f"{host / 'logs'}:/logs", "--memory", s.memory, "--cpus", f"{s.cpus:g}",
                *(["--bind", f"{self._visible(s.driver_dir)}:/tmp/{DRIVER_IN_TMP}:ro"] if s.driver_dir else []),
                *(["--bind", f"{self._visible(s.harness_dir)}:/tmp/{HARNESS_IN_TMP}:ro"] if s.harness_dir else [])]
        args += ["--net", "--network", "none"]  # its own, --network or not (whose way out is placed in it)
        res = await self._run(*args, path, name, timeout=120)
        if res.exit_code != 0:  # a loaded host's starter can fail once (exit 255): what is left of it goes, then once more
            await self._run("instance", "stop", "--force", name, timeout=60)
            res = await self._run(*args, path, name, timeout=120)
        if res.exit_code != 0:
            self.remove(host)
            raise SandboxError(f"apptainer could not start an instance of {path}: {_last_error(res)}")
        sandbox = SingularitySandbox(self, name, host, workdir)
        sandbox.task_env = dict(spec.env)
        try:
            if s.network and self.egress is not None:  # before the agent's first command
                sandbox.network_env = egress_env()
                sandbox.egress_stop = await self.egress.serve(await listener_inside(await self.init_pid(name)), name)
            await sandbox.learn_environment(workdir)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _copy_out(self, image: str, path: str, into: Path) -> None:
        """What the image holds at `path` (a row's cwd), copied into the prompt's work directory."""
        res = await self._run("-q", "exec", "--containall", "--cleanenv", "--no-home", "--net", "--network", "none",
                              "--bind", f"{into}:/.hermes-batch-work", image, "/bin/sh", "-c",
                              'if [ -d "$1" ]; then cp -a "$1/." /.hermes-batch-work/; fi', "sh", path, timeout=120)
        if res.exit_code != 0:
            raise SandboxError(f"cannot copy the image's {path}: {_last_error(res)}")

    async def stop_init(self, name: str) -> None:
        """SIGSTOP, from the host, to the instance's init: commands still run (`exec` joins the
        instance's namespaces by itself) and nothing left of the agent's runs with them."""
        os.kill(await self.init_pid(name), signal.SIGSTOP)

    async def init_pid(self, name: str) -> int:
        """The instance's init (its PID 1), as this machine knows it."""
        res = await self._run("instance", "list", "--json", name, timeout=60)
        try:
            [entry] = json.loads(res.stdout)["instances"]
            pid = int(entry["pid"])
            status = Path(f"/proc/{pid}/status").read_text()
        except (ValueError, KeyError, TypeError, OSError):
            raise SandboxError(f"instance {name} is gone: {_last_error(res)}") from None
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid[-1:] != ["1"]:
            raise SandboxError(f"instance {name}: process {pid} is not its init (NSpid {nspid})")
        return pid

    async def stop_instance(self, name: str) -> None:
        await self._run("instance", "stop", "-F", name, timeout=60)

    async def sweep_orphans(self) -> int:
        res = await self._run("instance", "list", "--json", timeout=60)
        try:
            names = [i["instance"] for i in json.loads(res.stdout or "{}").get("instances", [])]
        except ValueError:
            names = []
        mine = [n for n in names if n.startswith(f"hb-{self.run_key}-")]
        for n in mine:
            await self.stop_instance(n)
        self.disks.sweep()
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.is_dir() and not p.is_symlink() and not p.name.startswith("."):
                    remove_tree(p)
        return len(mine)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def _last_error(res: ExecResult) -> str:
    lines = [ln for ln in (res.stderr + res.stdout).splitlines() if "FATAL" in ln or "ERROR" in ln]
    return (lines[-1] if lines else (res.stderr.strip() or f"exit code {res.exit_code}"))[:500]
