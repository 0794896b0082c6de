"""Sandbox backends: a name → class registry over one small protocol (see `base.py`).

Backends are imported only when chosen, so the heavy SDKs (docker, modal, flamepy) stay optional.
Adding a backend is one file plus one line here.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from pydantic import BaseModel

from .base import (
    Backend,
    BackendSettings,
    BaseBackend,
    ExecResult,
    ImageUnavailable,
    Sandbox,
    SandboxError,
    SandboxSpec,
)


class Entry(NamedTuple):
    target: str  # "module:Class" of this package, imported when the backend is chosen
    extra: str | None  # the pip extra that installs its SDK
    uses_images: bool  # a prompt's image picks what its sandbox runs (containers); known without the SDK


REGISTRY: dict[str, Entry] = {
    "local": Entry("local:LocalBackend", None, uses_images=False),
    "docker": Entry("docker:DockerBackend", "docker", uses_images=True),
    "modal": Entry("modal:ModalBackend", "modal", uses_images=True),
    "singularity": Entry("singularity:SingularityBackend", None, uses_images=True),
    "flame": Entry("flame:FlameBackend", "flame", uses_images=False),
}


class BackendUnavailable(RuntimeError):
    pass


def uses_images(name: str) -> bool:
    return REGISTRY[name].uses_images if name in REGISTRY else False


def load_backend(name: str, settings: BackendSettings | dict[str, Any]) -> Backend:
    """The backend `name`, configured from `settings` (its own Settings model picks its fields)."""
    if name not in REGISTRY:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of: {', '.join(REGISTRY)}")
    module_name, cls_name = REGISTRY[name].target.split(":")
    try:
        module = importlib.import_module(f".{module_name}", __package__)
    except ImportError as exc:
        extra = REGISTRY[name].extra
        hint = f" Install it with: pip install 'hermes-batch[{extra}]'" if extra else ""
        raise BackendUnavailable(f"backend {name!r} needs a package that is not installed ({exc.name}).{hint}") from exc
    cls = getattr(module, cls_name)
    wanted = getattr(cls, "Settings", BackendSettings)
    if not isinstance(settings, wanted):
        data = settings.model_dump() if isinstance(settings, BaseModel) else settings
        settings = wanted.model_validate(data)
    return cls(settings)


__all__ = [
    "REGISTRY", "Backend", "BackendSettings", "BackendUnavailable", "BaseBackend", "ExecResult", "ImageUnavailable",
    "Sandbox", "SandboxError", "SandboxSpec", "load_backend", "uses_images",
]
