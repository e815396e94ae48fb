"""The backend protocol and registry.

A backend is a vendor adapter (nvidia, amd, cpu). `probe()` finds real hardware and never
raises; `supports()` says whether a Choice runs on accelerated kernels for a layer; the rest
(apply, microbench, export) is provided by each vendor package when its hardware is present.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from autoplan.errors import AutoplanError, UnknownNameError


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found: `available` with details, or the reason it is unavailable."""

    backend: str
    available: bool
    reason: str = ""
    devices: tuple[dict[str, Any], ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "reason": self.reason,
            "devices": list(self.devices),
            "details": self.details,
        }


@runtime_checkable
class Backend(Protocol):
    name: str

    def probe(self) -> ProbeResult: ...


_REGISTRY: dict[str, Callable[[], Backend]] = {}


def register_backend(name: str) -> Callable[[Callable[[], Backend]], Callable[[], Backend]]:
    """Class/factory decorator: register a backend under a unique name."""

    def deco(factory: Callable[[], Backend]) -> Callable[[], Backend]:
        if name in _REGISTRY:
            raise AutoplanError(f"backend '{name}' is registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def get_backend(name: str) -> Backend:
    _load_builtin()
    if name not in _REGISTRY:
        raise UnknownNameError("backend", name, _REGISTRY)
    return _REGISTRY[name]()


def backend_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Importing the vendor packages registers them; vendor libraries inside stay lazy.
    import autoplan.backends.amd  # noqa: F401
    import autoplan.backends.cpu  # noqa: F401
    import autoplan.backends.nvidia  # noqa: F401


__all__ = ["Backend", "ProbeResult", "backend_names", "get_backend", "register_backend"]
