"""The `local` target: this machine's CPU as a Target, built from the CPU probe.

Bandwidth and GEMM rates are measured (a few seconds), then cached as JSON in the user cache
dir (`$AUTOPLAN_CACHE`, else ~/.cache/autoplan) keyed by CPU model and core count, so later
calls are instant. `refresh=True` measures again.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from pydantic import ValidationError

from autoplan.atomic import write_json_atomic
from autoplan.backends.cpu.probe import (
    BF16_FLAGS,
    INT8_AVX2_FLAGS,
    INT8_FLAGS,
    CpuInfo,
    cpu_info,
    measure_bandwidth,
    measure_matmul,
)
from autoplan.cache_dir import cache_root
from autoplan.targets import Figure, Target

# Bump when the measurement or the Target schema changes, so old cache files are redone.
# 2: int8 peak on AVX2-only CPUs (ORT MatMulInteger); 3: the machine it was measured on
CACHE_VERSION = 3
# AWS m7i on-demand, 2026 (hw-facts §1e [C3X]): the default price of one vCPU-hour.
PRICE_PER_VCPU_HOUR = 0.0504
# No power reading on most machines; a rough per-core figure keeps J/token finite.
ASSUMED_WATTS_PER_CORE = 10.0


def cache_dir() -> Path:
    """Where autoplan caches measurements: `$AUTOPLAN_CACHE` or ~/.cache/autoplan."""
    return cache_root()


def cache_path(info: CpuInfo) -> Path:
    """The cache file for this CPU model and core count."""
    slug = re.sub(r"[^a-z0-9]+", "-", info.model.lower()).strip("-") or "cpu"
    return cache_dir() / f"local-target-{slug}-{info.cores}c.json"


def _family(info: CpuInfo) -> str:
    # The widest matrix/vector unit decides which efficiency constants apply.
    if "amx_bf16" in info.flags or "amx_int8" in info.flags:
        return "local-amx"
    if "avx512f" in info.flags:
        return "local-avx512"
    if "avx2" in info.flags:
        return "local-avx2"
    if info.arch in ("aarch64", "arm64"):
        return "local-arm64"
    return "local-generic"


def _measured(value: float, note: str) -> Figure:
    return Figure(value=round(value, 6), source="measured", note=note)


def _power(info: CpuInfo) -> Figure:
    rapl = Path("/sys/class/powercap/intel-rapl:0/constraint_0_max_power_uw")
    try:
        return _measured(int(rapl.read_text()) / 1e6, "RAPL package power limit")
    except (OSError, ValueError):
        return Figure(
            value=ASSUMED_WATTS_PER_CORE * info.cores,
            source="assumed",
            uncertain=True,
            note=f"no power reading; {ASSUMED_WATTS_PER_CORE:g} W per core assumed",
        )


def _peaks(info: CpuInfo) -> dict[str, Figure]:
    # (peak name, what measures it): only dtypes the CPU has native math for count as peaks.
    wanted = [("fp32", "fp32")]
    if info.has_any(BF16_FLAGS):
        wanted.append(("bf16", "bf16"))
    if info.has_any(INT8_FLAGS):
        wanted.append(("int8", "int8"))
    elif info.has_any(INT8_AVX2_FLAGS):
        wanted.append(("int8", "int8_ort"))
    peaks: dict[str, Figure] = {}
    for kind, how in wanted:
        try:
            rate, n = measure_matmul(how)
        except (RuntimeError, NotImplementedError):  # torch lacks the kernel here
            continue
        engine = "ONNX Runtime MatMulInteger" if how == "int8_ort" else "torch"
        peaks[kind] = _measured(rate, f"{engine} {n}x{n} GEMM, {info.threads} threads")
    return peaks


def machine_of(info: CpuInfo) -> str:
    """The machine as plans record it: what its measured figures depend on."""
    cpuid = f" ({info.cpuid})" if info.cpuid else ""
    return f"{info.model}{cpuid}, {info.cores} cores, {info.threads} threads"


def measure_local_target(info: CpuInfo) -> Target:
    """Measure this machine (a few seconds) and describe it as a Target."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    gbps, method = measure_bandwidth()
    caches = info.caches_kb
    stamp = time.strftime("%Y-%m-%d")
    # Other jobs on the cores lower every figure below (this dev box's first probe, at load
    # ~5, read 22 GB/s and 0.08 TFLOP/s fp32; quiet, 55 GB/s and 0.23): say so in the target.
    busy = (f"; measured at load average {load:.1f} on {info.cores} cores: re-run `autoplan "
            "probe --refresh` on a quiet machine") if load > 0.5 * info.cores else ""
    return Target(
        name="local",
        description=f"this machine: {info.model}, {info.cores} cores (measured {stamp}{busy})",
        vendor="cpu-local",
        kind="cpu",
        family=_family(info),
        cores=info.cores,
        machine=machine_of(info),
        features=tuple(sorted(info.flags)),
        memory_gb=_measured(info.memory_gb, "MemTotal from /proc/meminfo"),
        bandwidth_gbps=_measured(gbps, method),
        peak_tflops=_peaks(info),  # type: ignore[arg-type]
        tdp_w=_power(info),
        price_per_hour=Figure(
            value=round(PRICE_PER_VCPU_HOUR * info.threads, 4),
            source="C3X",
            uncertain=True,
            note=f"derived: AWS m7i {PRICE_PER_VCPU_HOUR} $/vCPU-h (2026) x {info.threads} vCPU",
        ),
        l2_mb=_measured(caches["L2"] / 1024, "per core, /sys cache info") if "L2" in caches else None,
        llc_mb=_measured(caches["L3"] / 1024, "/sys cache info") if "L3" in caches else None,
        clock_ghz=_measured(info.clock_ghz, "/proc/cpuinfo current clock") if info.clock_ghz else None,
        measured=True,
    )


def _load(path: Path) -> Target | None:
    try:
        payload = json.loads(path.read_text())
        if payload.get("version") != CACHE_VERSION:
            return None
        return Target.model_validate(payload["target"])
    except (OSError, ValueError, KeyError, ValidationError):
        return None  # unreadable or stale: measure again


def _save(path: Path, target: Target) -> None:
    # Atomic: parallel workers may read the cache while one process writes it.
    write_json_atomic(path, {"version": CACHE_VERSION, "target": target.model_dump(mode="json")})


def local_target(refresh: bool = False) -> Target:
    """This machine as a Target, from the cache unless `refresh` or nothing is cached.

    Args:
        refresh: measure again even when a cached measurement exists.

    Returns:
        The measured `local` target (figures with source "measured").
    """
    info = cpu_info()
    path = cache_path(info)
    cached = None if refresh else _load(path)
    if cached is not None and cached.machine == machine_of(info):  # else another CPU's
        return cached
    target = measure_local_target(info)
    try:
        _save(path, target)
    except OSError:
        pass  # a read-only home still gets a (slower) measured target
    return target


__all__ = ["cache_dir", "cache_path", "local_target", "machine_of", "measure_local_target"]
