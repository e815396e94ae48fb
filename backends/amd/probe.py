"""AMD Instinct GPUs through amdsmi (imported only when probing).

`import amdsmi` raises KeyError (and prints to stdout) when libamd_smi.so is absent, so the
import is wrapped and silenced; every failure becomes "unavailable: <reason>", never an error.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from collections.abc import Callable
from typing import Any

from autoplan.backends.base import ProbeResult
from autoplan.targets import match_device


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - amdsmi getters fail per field on some boards
        return None


def _import_amdsmi() -> tuple[Any, str]:
    """(module, "") or (None, why it failed)."""
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            return importlib.import_module("amdsmi"), ""
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - KeyError when the .so is missing
        said = chatter.getvalue().strip().splitlines()
        detail = said[0] if said else f"{type(exc).__name__}: {exc}"
        return None, f"amdsmi cannot load ({detail}); install ROCm's amd-smi-lib"


def _device(amdsmi: Any, index: int, handle: Any) -> dict[str, Any]:
    asic = _try(lambda: amdsmi.amdsmi_get_gpu_asic_info(handle)) or {}
    name = str(asic.get("market_name") or asic.get("asic_name") or "unknown AMD GPU")
    vram = _try(lambda: amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM))
    power = _try(lambda: amdsmi.amdsmi_get_power_cap_info(handle)["power_cap"])
    target = match_device(name)
    return {
        "index": index,
        "name": name,
        "gfx": asic.get("target_graphics_version"),
        "memory_gb": round(vram / 1e9, 1) if vram else None,
        "power_limit_w": round(power / 1e6) if power else None,  # amdsmi reports microwatts
        "target": target.name if target else None,
    }


def probe_amd() -> ProbeResult:
    """Find AMD GPUs; never raises."""
    amdsmi, why = _import_amdsmi()
    if amdsmi is None:
        return ProbeResult("amd", False, f"unavailable: {why}")
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:  # noqa: BLE001
        return ProbeResult("amd", False, f"unavailable: amdsmi_init failed ({exc})")
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        devices = tuple(_device(amdsmi, i, h) for i, h in enumerate(handles))
    except Exception as exc:  # noqa: BLE001
        return ProbeResult("amd", False, f"unavailable: amdsmi query failed ({exc})")
    finally:
        _try(amdsmi.amdsmi_shut_down)
    if not devices:
        return ProbeResult("amd", False, "unavailable: amdsmi reports no GPUs")
    matched = sorted({d["target"] for d in devices if d["target"]})
    reason = f"{len(devices)} GPU(s)" + (f"; target {', '.join(matched)}" if matched else "")
    return ProbeResult("amd", True, reason, devices)


__all__ = ["probe_amd"]
