"""Crash-safe file writes."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync the directory: the file is either old or new, never torn."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: the old file stays, and no temporary one beside it
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json_flag(name: str, where: str) -> Any:
    """A flag's JSON file, or a ValueError naming the flag, the file and what is wrong."""
    path = Path(where)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{name} not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--{name}={path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"--{name}={path} cannot be read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} {path} is not valid JSON: {exc}") from None
