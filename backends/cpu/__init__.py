"""CPU backend: probes this machine (flags, caches, measured bandwidth and GEMM rates) and
describes it as the `local` target. torch is imported only when measuring."""

from __future__ import annotations

from autoplan.backends.base import ProbeResult, register_backend
from autoplan.formats import Choice
from autoplan.runtimes import Support, backend_supports
from autoplan.targets import Target


def probe_cpu(refresh: bool = False) -> ProbeResult:
    """What the CPU backend finds; never raises.

    Args:
        refresh: measure again instead of reading the cached local target.
    """
    try:
        from autoplan.backends.cpu.local_target import cache_path, local_target
        from autoplan.backends.cpu.probe import cpu_info
        from autoplan.targets import match_device

        info = cpu_info()
        target = local_target(refresh=refresh)
    except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
        return ProbeResult("cpu", False, f"unavailable: {type(exc).__name__}: {exc}")
    closest = match_device(info.model)
    device = {
        "name": info.model,
        "arch": info.arch,
        "cores": info.cores,
        "threads": info.threads,
        "flags": sorted(info.flags),
        "caches_kb": info.caches_kb,
        "memory_gb": round(info.memory_gb, 1),
        "target": "local",
        "catalog_match": closest.name if closest else None,
    }
    details = {
        "bandwidth_gbps": target.bandwidth_gbps.value,
        "peak_tflops": {k: f.value for k, f in target.peak_tflops.items()},
        "family": target.family,
        "cache_file": str(cache_path(info)),
    }
    reason = f"{info.cores} cores; measured as target 'local'"
    return ProbeResult("cpu", True, reason, (device,), details)


@register_backend("cpu")
class CpuBackend:
    """The host CPU, always present."""

    name = "cpu"
    platforms = ("cpu",)

    def probe(self) -> ProbeResult:
        """Probe the host CPU (cached measurement)."""
        return probe_cpu()

    def supports(self, target: Target, runtime: str, choice: Choice) -> Support:
        """Whether `runtime` accelerates `choice` on a CPU target (runtime matrix)."""
        return backend_supports(self.name, self.platforms, target, runtime, choice)


__all__ = ["CpuBackend", "probe_cpu"]
