"""How a backend times a search space's layer shapes with a runtime's own kernels on this
machine (``--measure-kernels``): registered per (backend, runtime), by the backend itself or
by the engine that runs the kernels (llama.cpp's ggml). Imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoplan.errors import AutoplanError


@dataclass(frozen=True)
class KernelTimer:
    """``time(loaded, space, workload, threads=, progress=)`` returns a cost table
    (backends/microbench.py's schema) the cost model reads instead of its analytic GEMM
    times; ``label`` names the kernels in the plan's note, e.g. "ONNX Runtime"."""

    label: str
    time: Callable[..., dict[str, Any]]


_TIMERS: dict[tuple[str, str], KernelTimer] = {}


def register_kernel_timer(backend: str, runtime: str, timer: KernelTimer) -> KernelTimer:
    """Add how ``backend`` times ``runtime``'s kernels.

    Raises:
        AutoplanError: that backend and runtime already have a timer.
    """
    if (backend, runtime) in _TIMERS:
        raise AutoplanError(f"kernel timer for {backend}/{runtime} is registered twice")
    _TIMERS[(backend, runtime)] = timer
    return timer


def registered_timer(backend: str, runtime: str) -> KernelTimer | None:
    return _TIMERS.get((backend, runtime))


__all__ = ["KernelTimer", "register_kernel_timer", "registered_timer"]
