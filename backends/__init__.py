"""Sandbox backends: a name → class registry over one small protocol (see `base.py`).

Each backend lives in one file and declares its own flags (its `Settings`, a subclass of
`BackendSettings`). Its SDK is an optional extra, imported with the module but guarded, so a
backend's flags can be read (and checked) without it; only running the backend needs it. Adding a
backend is one file plus one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
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
    target: str  # "module:Class" of this package, imported when the backend (or its flags) is needed
    extra: str | None  # the pip extra that installs its SDK
    uses_images: bool  # a prompt's image picks what its sandbox runs (containers); known without the SDK
    binds_harness: bool = False  # hands each sandbox the agent harness installed on this machine, read-only


REGISTRY: dict[str, Entry] = {
    "local": Entry("local:LocalBackend", None, uses_images=False, binds_harness=True),
    "docker": Entry("docker:DockerBackend", "docker", uses_images=True, binds_harness=True),
    "modal": Entry("modal:ModalBackend", "modal", uses_images=True),
    "singularity": Entry("singularity:SingularityBackend", None, uses_images=True, binds_harness=True),
    "flame": Entry("flame:FlameBackend", "flame", uses_images=False),
}


class BackendUnavailable(RuntimeError):
    pass


def uses_images(name: str) -> bool:
    return REGISTRY[name].uses_images if name in REGISTRY else False


def harness_backends() -> list[str]:
    """The backends that can run an agent harness (`--agent`): they bind its installed directory."""
    return [name for name, entry in REGISTRY.items() if entry.binds_harness]


def _module(name: str) -> ModuleType:
    if name not in REGISTRY:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of: {', '.join(REGISTRY)}")
    return importlib.import_module(f".{REGISTRY[name].target.split(':')[0]}", __package__)


def backend_class(name: str) -> type[BaseBackend]:
    cls: type[BaseBackend] = getattr(_module(name), REGISTRY[name].target.split(":")[1])
    return cls


def settings_class(name: str) -> type[BackendSettings]:
    """The flags backend `name` reads (its SDK need not be installed)."""
    return backend_class(name).Settings


def flag_owner(flag: str, first: str | None = None) -> str | None:
    """A backend that reads `--flag` (`first` is asked first, then the others in order), or None.
    Only the backends asked are imported: a run whose flags are all its backend's imports no other."""
    for name in ([first] if first in REGISTRY else []) + [n for n in REGISTRY if n != first]:
        if flag in settings_class(name).flag_fields():
            return name
    return None


def all_flags() -> dict[str, tuple[Any, list[str]]]:
    """Every backend's flags (for `--help`): name → (its field, the backends that read it)."""
    found: dict[str, tuple[Any, list[str]]] = {}
    for name in REGISTRY:
        for flag, field in settings_class(name).flag_fields().items():
            found.setdefault(flag, (field, []))[1].append(name)
    return found


def sandbox_settings(backend: str, given: dict[str, Any]) -> BackendSettings:
    """The chosen backend's settings from the sandbox flags given. A flag of another backend is
    checked by that backend's own settings (a bad value is an error wherever it is meant to go),
    then left out; a flag no backend reads raises KeyError."""
    own = settings_class(backend)
    for flag, value in given.items():
        if flag not in own.model_fields:
            owner = flag_owner(flag, backend)
            if owner is None:
                raise KeyError(flag)
            settings_class(owner).model_validate({flag: value})
    return own.model_validate({k: v for k, v in given.items() if k in own.model_fields})


def load_backend(name: str, settings: BackendSettings | dict[str, Any]) -> Backend:
    """The backend `name`, configured from `settings` (its own Settings model picks its fields)."""
    module = _module(name)
    missing = getattr(module, "SDK_MISSING", None)
    if missing:
        extra = REGISTRY[name].extra
        hint = f" Install it with: pip install 'hermes-batch[{extra}]'" if extra else ""
        raise BackendUnavailable(f"backend {name!r} needs a package that is not installed ({missing}).{hint}")
    cls = backend_class(name)
    if not isinstance(settings, cls.Settings):
        data = settings.model_dump() if isinstance(settings, BaseModel) else settings
        settings = cls.Settings.model_validate(data)
    return cls(settings)


__all__ = [
    "REGISTRY", "Backend", "BackendSettings", "BackendUnavailable", "BaseBackend", "ExecResult", "ImageUnavailable",
    "Sandbox", "SandboxError", "SandboxSpec", "all_flags", "backend_class", "flag_owner", "load_backend",
    "harness_backends", "sandbox_settings", "settings_class", "uses_images",
]
