"""CPU backend: probes this machine (flags, caches, measured bandwidth and GEMM rates) and
describes it as the `local` target. torch is imported only when measuring."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autoplan.backends.base import Backend, KernelEntry, ProbeResult, register_backend
from autoplan.backends.kernel_timers import KernelTimer, register_kernel_timer
from autoplan.formats import Choice, OrtNode, format_spec
from autoplan.targets import Target

if TYPE_CHECKING:
    from autoplan.models import LoadedModel
    from autoplan.workload import Workload


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


def _ort_op(op: str) -> Callable[[Choice], str]:
    """Requirement: the choice's FormatSpec names ONNX Runtime node ``op``, on a layer the
    export stores dense (masks are applied to the weights; ORT has no sparse GEMM)."""

    def check(choice: Choice) -> str:
        node = format_spec(choice.precision).onnx
        if not isinstance(node, OrtNode) or node.op != op:
            return f"{choice.precision.value} is not stored as an ORT {op} node"
        return ""

    return check


@register_backend("cpu")
class CpuBackend(Backend):
    """The host CPU, always present; runs ONNX Runtime (and llama.cpp through its engine)."""

    name = "cpu"
    platforms = ("cpu",)
    exporters = ("onnx", "gguf")
    kernels = (
        KernelEntry("ort.MatMulNBits", (_ort_op("MatMulNBits"),)),
        KernelEntry("ort.DynamicQuantizeMatMul", (_ort_op("MatMulInteger"),)),
        KernelEntry("ort.MatMul", (_ort_op("MatMul"),)),
    )

    def probe(self) -> ProbeResult:
        """Probe the host CPU (cached measurement)."""
        return probe_cpu()

    def measured_targets(self) -> dict[str, Callable[[], Target]]:
        """`local`: this machine, measured on first use and cached (local_target.py)."""
        return {"local": _local}


def _time_ort_kernels(loaded: LoadedModel, space: Any, workload: Workload,
                      **kw: Any) -> dict[str, Any]:
    from autoplan.backends.cpu.predict import search_kernel_table

    return search_kernel_table(loaded, space, workload, **kw)


register_kernel_timer("cpu", "onnxruntime", KernelTimer("ONNX Runtime", _time_ort_kernels))


def _local() -> Target:
    from autoplan.backends.cpu.local_target import local_target

    return local_target()


__all__ = ["CpuBackend", "probe_cpu"]
