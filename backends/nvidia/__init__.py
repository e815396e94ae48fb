"""NVIDIA backend: probes GPUs through NVML; format support comes from the runtime matrix."""

from __future__ import annotations

from autoplan.backends.base import ProbeResult, register_backend
from autoplan.backends.nvidia.probe import probe_nvidia
from autoplan.formats import Choice
from autoplan.runtimes import Support, backend_supports
from autoplan.targets import Target


@register_backend("nvidia")
class NvidiaBackend:
    """NVIDIA GPUs (pynvml is imported only inside probe())."""

    name = "nvidia"
    platforms = ("nvidia-gpu",)

    def probe(self) -> ProbeResult:
        """Find NVIDIA GPUs; never raises."""
        return probe_nvidia()

    def supports(self, target: Target, runtime: str, choice: Choice) -> Support:
        """Whether `runtime` accelerates `choice` on an NVIDIA target (runtime matrix)."""
        return backend_supports(self.name, self.platforms, target, runtime, choice)


__all__ = ["NvidiaBackend"]
