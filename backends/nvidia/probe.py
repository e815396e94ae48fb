"""NVIDIA GPUs through NVML (nvidia-ml-py's `pynvml`, imported only when probing).

Each device is reported with its name, compute capability, memory and power limit, and
matched to a catalog target by name. Nothing here raises: a missing library or driver is
reported as "unavailable: <reason>".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from autoplan.backends.base import ProbeResult
from autoplan.targets import match_device


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - NVML getters fail per field on some boards
        return None


def _device(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    cc = _try(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    memory = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total)
    power_mw = _try(lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle))
    target = match_device(name)
    return {
        "index": index,
        "name": name,
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "memory_gb": round(memory / 1e9, 1) if memory else None,
        "power_limit_w": round(power_mw / 1000) if power_mw else None,
        "target": target.name if target else None,
    }


def probe_nvidia() -> ProbeResult:
    """Find NVIDIA GPUs; never raises."""
    try:
        nvml = importlib.import_module("pynvml")
    except Exception as exc:  # noqa: BLE001
        why = f"nvidia-ml-py is not installed ({exc}); pip install 'autoplan[nvidia]'"
        return ProbeResult("nvidia", False, f"unavailable: {why}")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return ProbeResult("nvidia", False, f"unavailable: no NVIDIA driver ({exc})")
    try:
        devices = tuple(_device(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
        driver = _try(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
    except Exception as exc:  # noqa: BLE001
        return ProbeResult("nvidia", False, f"unavailable: NVML query failed ({exc})")
    finally:
        _try(nvml.nvmlShutdown)
    if not devices:
        return ProbeResult("nvidia", False, "unavailable: the driver reports no GPUs")
    return ProbeResult("nvidia", True, _summary(devices), devices, {"driver": driver})


def _summary(devices: tuple[dict[str, Any], ...]) -> str:
    matched = sorted({d["target"] for d in devices if d["target"]})
    unmatched = sorted({d["name"] for d in devices if not d["target"]})
    parts = [f"{len(devices)} GPU(s)"]
    if matched:
        parts.append(f"target {', '.join(matched)}")
    if unmatched:
        parts.append(f"no catalog entry for {', '.join(unmatched)}: pass --target with the closest")
    return "; ".join(parts)


__all__ = ["probe_nvidia"]
