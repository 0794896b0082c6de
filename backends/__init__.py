"""Sandbox backends: a name → class registry over one small protocol (see `base.py`).

Backends are imported only when chosen, so the heavy SDKs (docker, modal, flamepy) stay optional.
"""

from __future__ import annotations

import importlib

from .base import (
    Backend,
    BackendSettings,
    ExecResult,
    ImageUnavailable,
    Sandbox,
    SandboxError,
    SandboxSpec,
)

REGISTRY: dict[str, str] = {
    "local": "backends.local:LocalBackend",
    "docker": "backends.docker:DockerBackend",
    "modal": "backends.modal:ModalBackend",
    "singularity": "backends.singularity:SingularityBackend",
    "flame": "backends.flame:FlameBackend",
}

# What to install when a backend's SDK is missing.
EXTRAS = {"docker": "docker", "modal": "modal", "flame": "flame"}


class BackendUnavailable(RuntimeError):
    pass


def load_backend(name: str, settings: BackendSettings) -> Backend:
    if name not in REGISTRY:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of: {', '.join(REGISTRY)}")
    module_name, cls_name = REGISTRY[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS.get(name)
        hint = f" Install it with: pip install 'hermes-batch[{extra}]'" if extra else ""
        raise BackendUnavailable(f"backend {name!r} needs a package that is not installed ({exc.name}).{hint}") from exc
    return getattr(module, cls_name)(settings)


__all__ = [
    "REGISTRY", "Backend", "BackendSettings", "BackendUnavailable", "ExecResult", "ImageUnavailable",
    "Sandbox", "SandboxError", "SandboxSpec", "load_backend",
]
