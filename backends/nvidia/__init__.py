"""NVIDIA backend: probes GPUs through NVML; format support comes from the runtime matrix."""

from __future__ import annotations

from autoplan.backends.base import (Backend, KernelEntry, ProbeResult, Requirement, named_by_format,
                                    register_backend)
from autoplan.backends.nvidia.probe import probe_nvidia
from autoplan.formats import Choice


def cuda_capability(major: int, minor: int) -> Requirement:
    """Requirement: a CUDA GPU of compute capability major.minor or newer is present."""

    def check(choice: Choice) -> str:
        import torch

        if not torch.cuda.is_available():
            return "needs an NVIDIA GPU with CUDA; none found"
        cc = torch.cuda.get_device_capability()
        if cc < (major, minor):
            return f"needs SM{major}{minor}+; this GPU is SM{cc[0]}{cc[1]}"
        return ""

    return check


@register_backend("nvidia")
class NvidiaBackend(Backend):
    """NVIDIA GPUs (pynvml is imported only inside probe())."""

    name = "nvidia"
    platforms = ("nvidia-gpu",)
    exporters = ("compressed-tensors", "modelopt")
    kernels = (
        KernelEntry("cusparselt", (named_by_format("cusparselt"), cuda_capability(8, 9))),
        KernelEntry("semi_structured", (named_by_format("semi_structured"), cuda_capability(8, 0))),
        KernelEntry("torch._scaled_mm_fp4", (named_by_format("torch._scaled_mm_fp4"),
                                             cuda_capability(10, 0))),
        KernelEntry("torch._scaled_mm", (named_by_format("torch._scaled_mm"),
                                         cuda_capability(8, 9))),
        KernelEntry("triton_bsr", (named_by_format("triton_bsr"), cuda_capability(8, 0))),
        KernelEntry("torch.linear", (named_by_format("torch.linear"),)),
    )

    def probe(self) -> ProbeResult:
        """Find the GPUs; never raises."""
        return probe_nvidia()


__all__ = ["NvidiaBackend", "cuda_capability"]
