"""GEMM kernel paths whose published timings depart from the family's BF16/FP8 kernels.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.efficiency import family_of
from autoplan.formats import Choice
from autoplan.targets import Target


@dataclass(frozen=True)
class KernelPath:
    """Efficiencies of one (family, math dtype) GEMM kernel, used instead of the family's."""

    eta_bw: float  # achieved / peak bandwidth while streaming the stored weights
    eta_c: float  # achieved / peak FLOP/s of the math dtype at large M
    fixed_s: float  # time of one call that neither bytes nor FLOPs explain (replaces kernel_s)
    evidence: str


_FP4_BLACKWELL = KernelPath(
    0.41, 0.45, 6.8e-6,
    "B200 CUTLASS NVFP4 GEMM timings [VLLM-20578] (N=6144 K=4096, M=1..16384) and "
    "[FI-1732] (M=1, N=K=8192): see autoplan/cost/kernels.py")

_PATHS: dict[tuple[str, str], KernelPath] = {
    ("blackwell", "fp4"): _FP4_BLACKWELL,
    ("blackwell-ultra", "fp4"): _FP4_BLACKWELL,  # prior: no B300 FP4 GEMM table
}


def kernel_path(target: Target, choice: Choice) -> KernelPath | None:
    """The kernel path of a choice's math on a target, None when the family's BF16/FP8
    kernels describe it (every GPU format but FP4 on Blackwell; every CPU)."""
    if target.kind != "gpu" or target.measured:
        return None
    return _PATHS.get((family_of(target), choice.precision.info.math))


def all_paths() -> dict[tuple[str, str], KernelPath]:
    """Every documented kernel path (for reports, docs and tests)."""
    return dict(_PATHS)


__all__ = ["KernelPath", "all_paths", "kernel_path"]
