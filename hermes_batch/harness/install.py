"""A harness's release installed once on this machine, into the user's cache (never a prompt's
sandbox): `pip install --target` from the package registry, whole or not at all, one installer at a
time. The directory is what sandboxes see, read-only (each backend binds it where it can: backends/)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import UserError

COMPLETE = ".complete"  # written last: a directory without it is an install that did not finish


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hermes-batch" / "harnesses"


def installed(name: str, requirement: str, progress: bool = True, installer: str = "pip") -> Path:
    """The directory holding `requirement` (`hermes-agent==0.19.0`; with `installer="npm"`,
    `@anthropic-ai/claude-code@2.1.332`, from the npm registry), installed now if it is not yet."""
    target = cache_root() / name
    if (target / COMPLETE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run (or worker) waits for the first install
        if (target / COMPLETE).exists():
            return target
        staging = target.with_name(f".{name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        if progress:
            print(f"installing {requirement} once, into {target} (from the {installer} registry)", file=sys.stderr)
        res = subprocess.run(_command(installer, staging, requirement), capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            said = [line for line in res.stderr.splitlines() if "WARNING: Location" not in line]
            raise UserError(f"{requirement} could not be installed: " + "\n".join(said[-15:]))
        (staging / COMPLETE).write_text(requirement + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        os.chmod(target, 0o755)
    return target


def _command(installer: str, staging: Path, requirement: str) -> list[str]:
    if installer == "npm":
        if shutil.which("npm") is None:
            raise UserError(f"{requirement} is installed with npm, and this machine has none (apt-get install npm)")
        # no install scripts: a package's platform executable comes as its optional dependency, run where it lies
        return ["npm", "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--ignore-scripts",
                "--no-save", "--loglevel=error", requirement]
    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
            "--target", str(staging), requirement]
