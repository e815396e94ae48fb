"""Loading the vendor backends, and what needs all of them: lookups by name or by target,
and target names that include the targets backends measure (`local`).

`autoplan.targets` is the catalog of data files and knows no backend; a backend that measures
a target registers it there when it is loaded (``load_backends``), so imports point from
backends down to the catalog, never back up.
"""

from __future__ import annotations

from functools import cache

from autoplan.backends.base import Backend, get_registered, registered_backends
from autoplan.errors import AutoplanError
from autoplan.targets import Target, get_target, register_measured_target


@cache
def load_backends() -> tuple[str, ...]:
    """Import the vendor packages (registering them) and register their measured targets.

    Idempotent; vendor libraries inside stay lazy. Returns the backend names, sorted.
    """
    import autoplan.backends.amd  # noqa: F401
    import autoplan.backends.cpu  # noqa: F401
    import autoplan.backends.nvidia  # noqa: F401

    for name in sorted(registered_backends()):
        for target, factory in get_registered(name).measured_targets().items():
            register_measured_target(target, factory)
    return tuple(sorted(registered_backends()))


def backend_names() -> list[str]:
    """Every backend name, sorted."""
    return list(load_backends())


def get_backend(name: str) -> Backend:
    """A backend by name.

    Raises:
        UnknownNameError: no such backend; lists the registered ones.
    """
    load_backends()
    return get_registered(name)


def backend_for(target: Target) -> Backend:
    """The backend that drives ``target``'s platform.

    Raises:
        AutoplanError: no backend drives it.
    """
    for name in load_backends():
        backend = get_registered(name)
        if backend.drives(target):
            return backend
    raise AutoplanError(f"no backend drives {target.name} ({target.platform} targets)")


def resolve_target(name: str) -> Target:
    """``autoplan.targets.get_target`` with every backend's measured targets registered."""
    load_backends()
    return get_target(name)


MEASURE_KERNELS_FIX = ("--measure-kernels times this machine's kernels: use it with --target "
                       "local and --runtime onnxruntime or llama.cpp")
MEASURE_OR_TABLE = "pass --measure-kernels or --cost-table, not both"


def measured_here(target: str) -> bool:
    """Whether a backend times `target`'s kernels on this machine (the CPU backend's
    `local`): the part of `--measure-kernels`' check the arguments answer, without
    importing a runtime (the search's preflight asks the backend about the runtime too)."""
    return any(target in get_registered(n).measured_targets() for n in load_backends())


__all__ = ["MEASURE_KERNELS_FIX", "MEASURE_OR_TABLE", "backend_for", "backend_names",
           "get_backend", "load_backends", "measured_here", "resolve_target"]
