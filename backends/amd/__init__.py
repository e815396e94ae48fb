"""AMD backend: probes Instinct GPUs through amdsmi; format support comes from the runtime
matrix (block-sparse runs on autoplan's Triton kernel in triton_bsr.py)."""

from __future__ import annotations

from autoplan.backends.amd.probe import probe_amd
from autoplan.backends.base import (Backend, KernelEntry, ProbeResult, named_by_format,
                                    register_backend)


@register_backend("amd")
class AmdBackend(Backend):
    """AMD Instinct GPUs (amdsmi is imported only inside probe())."""

    name = "amd"
    platforms = ("amd-gpu",)
    exporters = ("compressed-tensors",)
    kernels = (
        KernelEntry("triton_bsr", (named_by_format("triton_bsr"),)),
        KernelEntry("torch.linear", (named_by_format("torch.linear"),)),
    )

    def probe(self) -> ProbeResult:
        """Find the GPUs; never raises."""
        return probe_amd()


__all__ = ["AmdBackend"]
