"""Time and bytes of one linear layer (one GEMM) under one Choice: a roofline with overheads.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.efficiency import (
    BLOCK_COMPUTE_EFF,
    FamilyEfficiency,
    bandwidth_factor,
    math_efficiency_factor,
)
from autoplan.cost.kernels import kernel_path
from autoplan.cost.sparse import sparse24_speedup
from autoplan.errors import UnsupportedFormatError
from autoplan.formats import Choice, Precision
from autoplan.targets import Target


@dataclass(frozen=True)
class GemmTime:
    """One GEMM call: seconds (without kernel overhead) and what bounds it."""

    seconds: float
    bound: str  # "memory" | "compute" | "measured"


def sparse24_accelerated(target: Target, choice: Choice) -> bool:
    """Whether the target's hardware accelerates this N:M choice's math dtype (2:4 only)."""
    sp = choice.sparsity
    if sp.kind != "nm" or (sp.n, sp.m) != (2, 4):
        return False
    return target.sparse_multiplier(choice.precision.info.math) > 1.0


def stored_bits(target: Target, choice: Choice) -> float:
    """Bits stored per ORIGINAL weight as a runtime would hold this choice on this target.

    Patterns the target cannot accelerate (unstructured, N:M other than a supported 2:4) are
    served as dense matrices with zeros, so they keep the dense bits.
    """
    sp, bits = choice.sparsity, choice.precision.info.weight_bits
    if sp.kind == "channel":
        return sp.density * bits
    if sp.kind == "block" or sparse24_accelerated(target, choice):
        return choice.bits_per_weight()
    return bits


def math_peak(target: Target, choice: Choice, baseline: Precision) -> float:
    """FLOP/s of the matmul unit this choice runs on.

    Raises:
        UnsupportedFormatError: the target has no matrix peak for the choice's math dtype.
    """
    info = choice.precision.info
    peak = target.peak(info.math)
    if peak is None and info.weight_only:
        # Weight-only kernels compute in the activation dtype; on a CPU without BF16 units
        # that is the baseline (FP32) path.
        peak = target.peak(baseline.info.math)
    if peak is None:
        known = ", ".join(sorted(target.peak_tflops))
        raise UnsupportedFormatError(
            f"{target.name} cannot run {choice.precision.value}: it has no {info.math} matrix "
            f"units (it has: {known}); pick a precision whose math it supports"
        )
    return peak


def gemm_time(target: Target, eff: FamilyEfficiency, choice: Choice, m: float, n: int, k: int,
              baseline: Precision, *, weight_reads: float = 1.0,
              compute_eff: float = 1.0) -> GemmTime:
    """Roofline time of y[m, n] = x[m, k] @ W[n, k].T under a choice (no kernel overhead).

    `weight_reads` is the expected number of times the step reads the weight (a routed
    expert's: the chance a token of the step picks it; m is then its expected rows), and
    `compute_eff` scales eta_c (grouped expert GEMMs, cost/moe.py)."""
    info, sp = choice.precision.info, choice.sparsity
    path = kernel_path(target, choice)
    if path:
        eta_bw, eta_c = path.eta_bw, path.eta_c
    else:
        eta_bw, eta_c = eff.eta_bw, eff.eta_c * math_efficiency_factor(target, info.math)
    eta_c *= compute_eff
    n_eff = n * sp.density if sp.kind == "channel" else n
    weight_bytes = weight_reads * k * n * stored_bits(target, choice) / 8
    act_bytes = m * (k * info.act_bytes + n_eff * 2.0)
    mem_s = (weight_bytes + act_bytes) / (eta_bw * bandwidth_factor(target, choice)
                                          * target.bandwidth)
    flops = 2.0 * m * n * k
    if sp.kind == "channel":
        flops *= sp.density
    elif sp.kind == "block":
        flops *= sp.density / BLOCK_COMPUTE_EFF[sp.block]
    elif sparse24_accelerated(target, choice):
        flops /= sparse24_speedup(m, n, k, info.math, target)
    comp_s = flops / (eta_c * math_peak(target, choice, baseline))
    if comp_s > mem_s:
        return GemmTime(comp_s, "compute")
    return GemmTime(mem_s, "memory")


def kernels_per_call(choice: Choice) -> int:
    """GEMM kernel plus a dynamic activation-quantization kernel for W8A8/W4A4 formats
    (the block-quantized-activation formats quantize inside MatMulNBits: one kernel)."""
    info = choice.precision.info
    return 1 + (0 if info.weight_only or info.act_bytes >= 2 or info.act_group else 1)


def call_overhead(target: Target, eff: FamilyEfficiency, choice: Choice) -> float:
    """Fixed seconds of one call of a choice's GEMM (with its activation-quantization kernel,
    if any): the family's kernel_s per kernel, the GEMM's own fixed time on a kernel path."""
    path = kernel_path(target, choice)
    extra = path.fixed_s - eff.kernel_s if path else 0.0
    return kernels_per_call(choice) * eff.kernel_s + extra


__all__ = ["GemmTime", "call_overhead", "gemm_time", "kernels_per_call", "math_peak",
           "sparse24_accelerated", "stored_bits"]
