"""AMD backend: probes Instinct GPUs through amdsmi; format support comes from the runtime
matrix (block-sparse runs on autoplan's Triton kernel in triton_bsr.py)."""

from __future__ import annotations

from autoplan.backends.amd.probe import probe_amd
from autoplan.backends.base import ProbeResult, register_backend
from autoplan.formats import Choice
from autoplan.runtimes import Support, backend_supports
from autoplan.targets import Target


@register_backend("amd")
class AmdBackend:
    """AMD Instinct GPUs (amdsmi is imported only inside probe())."""

    name = "amd"
    platforms = ("amd-gpu",)

    def probe(self) -> ProbeResult:
        """Find AMD GPUs; never raises."""
        return probe_amd()

    def supports(self, target: Target, runtime: str, choice: Choice) -> Support:
        """Whether `runtime` accelerates `choice` on an AMD target (runtime matrix)."""
        return backend_supports(self.name, self.platforms, target, runtime, choice)


__all__ = ["AmdBackend"]
