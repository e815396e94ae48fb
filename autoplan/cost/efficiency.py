"""Efficiency constants of the analytic cost model: global per hardware FAMILY, never per point.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from autoplan.formats import Choice, Precision
from autoplan.targets import Target, get_target


@dataclass(frozen=True)
class FamilyEfficiency:
    """Efficiency constants of one hardware family."""

    family: str
    eta_bw: float
    eta_c: float
    kernel_s: float
    step_s: float
    power_frac: float
    evidence: str


_GPU_POWER = 0.75  # hw-facts §3.3: P_avg 60-90 % of TDP; middle of the range
_CPU_POWER = 0.70  # prior: CPUs serving LLMs run memory-bound, below full package power

_FAMILIES: dict[str, FamilyEfficiency] = {
    f.family: f
    for f in (
        FamilyEfficiency(
            "ampere", 0.70, 0.74, 4.5e-6, 40e-6, _GPU_POWER,
            "eta_bw: A100 Llama-3-8B BF16 decode 1,435.5/2,039 GB/s [TORCHAO-Q] (§3.4); eta_c: "
            "A100 BF16 231/312 TF at 16k^3 (§2H E3); kernel_s: llama.cpp 7B Q4_0 A100 at 38 % "
            "of peak BW (§2F) leaves ~2.3 ms/step of fixed time over ~400 kernels",
        ),
        FamilyEfficiency(
            "hopper", 0.69, 0.70, 3.5e-6, 40e-6, _GPU_POWER,
            "eta_bw: H100 M=1 8192^2 BF16 2.30 TB/s [HUMMING], FP8 GEMV 0.61-0.73 [VLLM-5144] "
            "(§3.4); eta_c: prior 0.70 (SlideSparse H100 absolutes are unreliable, §2H E3); "
            "kernel_s: llama.cpp 7B Q4_0 H100 at 32 % of peak BW (§2F)",
        ),
        FamilyEfficiency(
            "ada", 0.72, 0.85, 3.0e-6, 40e-6, _GPU_POWER,
            "eta_bw: RTX 4090 72 % (§2F); eta_c: RTX 4090 FP8 0.93-0.94 at 16k^3 (§2H E3), "
            "lowered for the L40S's lower clocks under its 350 W cap (prior)",
        ),
        FamilyEfficiency(
            "blackwell", 0.70, 0.65, 3.0e-6, 40e-6, _GPU_POWER,
            "eta_c: B200 FP8 and BF16 0.65 at 16k^3 (§2H E3), 0.23-0.42 at M=128-512 explained "
            "by bandwidth + kernel time (§2H E2); eta_bw: prior = Hopper (HBM3e)",
        ),
        FamilyEfficiency(
            "blackwell-ultra", 0.70, 0.65, 3.0e-6, 40e-6, _GPU_POWER,
            "prior: same as Blackwell (no published B300 kernel efficiency in the references)",
        ),
        FamilyEfficiency(
            "cdna3", 0.60, 0.50, 5.0e-6, 50e-6, _GPU_POWER,
            "eta_c 0.50 (BF16): below the MI300X's best-shape BF16 share, 708 / 1,307 = 0.54 "
            "(hipBLASLt-bench, [ROCM-MAF]), as a typical GEMM sits below the best one (AMD's "
            "typical attained rate is 74 % of the maximum on the MI325X, [ROCM-TAF]); FP8 via "
            "_MATH_SHARE; eta_bw, kernel_s, step_s: prior (no MI300X GEMV or per-kernel "
            "figure in the references, §4 gaps), below Hopper's",
        ),
        FamilyEfficiency(
            "cdna4", 0.60, 0.50, 5.0e-6, 50e-6, _GPU_POWER,
            "prior: same as CDNA3 (MI355X official efficiency not retrieved, §4)",
        ),
        FamilyEfficiency(
            "cpu", 0.60, 0.50, 15e-6, 100e-6, _CPU_POWER,
            "eta_bw: 0.41-0.74 on multi-socket CPUs depending on NUMA [LLAMA-11744] (§3.4), "
            "middle value; eta_c: prior (sustained AMX clock unknown, §1d); kernel_s: prior "
            "for a thread-pool barrier per op",
        ),
    )
}


@dataclass(frozen=True)
class StreamFigure:
    """Achieved device-memory read bandwidth of one part (a streaming microbenchmark)."""

    gbps: float
    source: str  # key in autoplan/data/references.toml
    note: str


# BabelStream (CUDA) `Dot`, the benchmark's read-only kernel (sum of a[i] * b[i]): the traffic
# eta_bw prices (weights and KV cache streamed in, little written back). Both parts measured
# by Azure with the same harness (Benchmarks/HBMBandwidth.py: BabelStream built for sm_90, 5
# runs), CUDA 12.6, driver 560, Xeon 8480C hosts, published side by side on 2024-09-23/24.
# The harness's other kernels give the same direction: Copy 2.90 / 4.01, Triad 2.97 / 4.15
# TB/s (H100 / H200).
_STREAM_READ: dict[str, StreamFigure] = {
    "h100-sxm": StreamFigure(3180.0, "AZ-ND-H100-V5", "ND H100 v5, BabelStream Dot 3.18 TB/s "
                             "(0.949 of 3.35), driver 560.35.03"),
    "h200": StreamFigure(4480.0, "AZ-ND-H200-V5", "ND H200 v5, BabelStream Dot 4.48 TB/s "
                         "(0.933 of 4.8), driver 560.28.03"),
}

# The part each family's eta_bw was measured on (the evidence strings above).
_ETA_BW_PART = {"hopper": "h100-sxm", "ampere": "a100-80g"}


@dataclass(frozen=True)
class ComputeFigure:
    """Max-achievable dense GEMM rate of one part, as its vendor measured it."""

    bf16_tflops: float
    fp8_tflops: float
    source: str  # key in autoplan/data/references.toml
    note: str


# AMD's "Max-Achievable FLOPs" table ([ROCM-MAF], Feb 2025): hipBLASLt-bench on the optimal
# shape (M 4096, N 4864 / 3648, K 32896), cold caches, trig_float inputs, the same harness
# and hipBLASLt branch for both parts (the input pattern flatters both parts alike, so the
# ratio stands; AMD's later normal-input figures exist for the MI325X only). The MI325X has the
# MI300X's CUs and datasheet peak but runs the dense GEMM at a higher clock (1,447 vs 1,207 MHz
# median for BF16), so the same eta_c would understate it by about a sixth.
_MAX_ACHIEVABLE: dict[str, ComputeFigure] = {
    "mi300x": ComputeFigure(708.0, 1273.0, "ROCM-MAF", "BF16 at 1,207 MHz, FP8 at 1,230 MHz"),
    "mi325x": ComputeFigure(843.0, 1519.0, "ROCM-MAF", "BF16 at 1,447 MHz, FP8 at 1,464 MHz"),
}

# The part each family's eta_c was set against (the evidence strings above).
_ETA_C_PART = {"cdna3": "mi300x"}


def _share_vs_family_part(target: Target, family_part: dict[str, str],
                          share: Callable[[Target], float | None]) -> float:
    """share(target) / share(the part its family's constant was set on); 1.0 for CPUs, for
    that part itself, and where either part has no figure (share returns None)."""
    if target.kind != "gpu" or target.measured:
        return 1.0
    ref_name = family_part.get(family_of(target))
    if ref_name is None or ref_name == target.name:
        return 1.0
    own, ref = share(target), share(get_target(ref_name))
    return own / ref if own and ref else 1.0


def _read_share(target: Target) -> float | None:
    fig = _STREAM_READ.get(target.name)
    return fig.gbps * 1e9 / target.bandwidth if fig else None


def _gemm_share(target: Target) -> float | None:
    fig, peak = _MAX_ACHIEVABLE.get(target.name), target.peak("bf16")
    return fig.bf16_tflops * 1e12 / peak if fig and peak else None


def part_bandwidth_factor(target: Target) -> float:
    """eta_bw of `target` relative to its family's: (achieved / peak bandwidth of the target)
    over (the same for the part the family's eta_bw was measured on), both from
    `_STREAM_READ`; 1.0 where either part has no figure (or the target is that part)."""
    return _share_vs_family_part(target, _ETA_BW_PART, _read_share)


def part_compute_factor(target: Target) -> float:
    """eta_c of `target` relative to its family's: the target's max-achievable BF16 share of
    its datasheet peak over the same for the part the family's eta_c was set against, both
    from `_MAX_ACHIEVABLE`; 1.0 where either part has no figure (or the target is that part).
    The FP8 ratio agrees within 1 % for the one pair listed (MI325X / MI300X: 1.191 BF16,
    1.193 FP8)."""
    return _share_vs_family_part(target, _ETA_C_PART, _gemm_share)


@dataclass(frozen=True)
class MathShare:
    """A math dtype's max-achievable share of its peak over BF16's, on one measured part."""

    ratio: float
    source: str  # key in autoplan/data/references.toml
    note: str


# Both shares from one harness on one part, so clocks, power cap and library cancel except
# where they treat the two dtypes differently (FP8 GEMMs draw more power per FLOP and run
# further below their peak). Only the ratio is used: the family's eta_c already prices the
# gap between a max-achievable shape and the GEMMs of a real model.
_MATH_SHARE: dict[tuple[str, str], MathShare] = {
    ("hopper", "fp8"): MathShare(
        (1402.6 / 1979) / (794.5 / 989), "MAMF",
        "H100 SXM, mamf-finder, torch 2.7.0+cu126: FP8 1,402.6 of 1,979 TFLOP/s (70.9 %), BF16 "
        "794.5 of 989 (80.3 %); the H200 (same die, same 700 W) is assumed to share it"),
    ("cdna3", "fp8"): MathShare(
        (1408.06 / 2614.9) / (831.40 / 1307.4), "ROCM-TAF",
        "MI325X at 1,000 W, hipBLASLt max-achievable GEMMs with normally distributed inputs "
        "(AMD, Sept 2026): FP8 1,408.06 of 2,615 TFLOP/s (53.8 %), BF16 831.40 of 1,307 "
        "(63.6 %). The earlier trig_float-initialised table ([ROCM-MAF]) gives 0.899 on the "
        "MI300X, but AMD notes that pattern lets FP8 hold a higher clock; the H100 pair above "
        "was measured on random normal inputs too"),
}


def math_efficiency_factor(target: Target, math: str) -> float:
    """eta_c multiplier for GEMMs in `math` ("fp8", "bf16", ...) on `target`: the measured
    share ratio of that dtype over BF16 for the target's family, 1.0 where none was measured
    (BF16 itself, INT8, every family without a pair, CPUs)."""
    if target.kind != "gpu" or target.measured:
        return 1.0
    share = _MATH_SHARE.get((family_of(target), math))
    return share.ratio if share else 1.0


def all_math_shares() -> dict[tuple[str, str], MathShare]:
    """Every documented math-dtype share (for reports, docs and tests)."""
    return dict(_MATH_SHARE)


# Family names the catalog uses that share a row above.
_FAMILY_ALIASES = {
    "hopper-pcie": "hopper", "ampere-sxm": "ampere", "blackwell-b300": "blackwell-ultra",
    "blackwell_ultra": "blackwell-ultra", "mi300": "cdna3", "mi355": "cdna4",
}

# Weight-only kernels dequantize in the GEMV loop and stream below the 16-bit bandwidth at
# small batch (hw-facts §3.4, §3.7 #2): A100 int8wo 56 % and int4wo 37 % vs BF16 70 %
# [TORCHAO-Q]; H100 Marlin W4 37 % vs W16 69 % [HUMMING]. Expressed relative to eta_bw so
# that they hold for every GPU family; CPUs dequantize in registers at memory speed (C4).
_WEIGHT_ONLY_BW_FACTOR = {8: 0.80, 4: 0.54}

# 2:4 kernels reach "up to 90 % SOL" of the dense kernel (cuSPARSELt, §2B K7): the byte
# reduction in decode is applied with this slightly lower bandwidth efficiency (§3.5).
SPARSE24_BW_FACTOR = 0.90

# Block-sparse (BSR) kernels: CUTLASS/Triton show 1.2-1.6x at 50 % sparsity when the block
# matches the memory layout (seeds-digest, per-vendor playbooks): efficiency of the kept
# blocks relative to a dense GEMM, larger blocks closer to dense tiles.
BLOCK_COMPUTE_EFF = {16: 0.60, 32: 0.70, 64: 0.80}
BLOCK_BW_FACTOR = 0.85  # index gathers cost some streaming efficiency (prior)


# Rows replacing a family's own for a while (`autoplan validate`'s leave-one-family-out).
_OVERRIDES: dict[str, FamilyEfficiency] = {}


def family_of(target: Target) -> str:
    """The efficiency row a target uses (catalog family names resolved through aliases)."""
    family = _FAMILY_ALIASES.get(target.family, target.family)
    if family in _FAMILIES:
        return family
    return "cpu" if target.kind == "cpu" else "hopper"


@contextmanager
def replaced_family(family: str, row: FamilyEfficiency) -> Iterator[None]:
    """Predict with `row` instead of `family`'s own constants inside the block."""
    _OVERRIDES[family] = row
    try:
        yield
    finally:
        del _OVERRIDES[family]


def transfer_row(family: str) -> FamilyEfficiency | None:
    """Constants for `family` taken from the OTHER families of its kind (the median of each
    constant), none of them set on this family's points; None when it has no such peer."""
    kind_of = lambda f: "cpu" if f == "cpu" else "gpu"
    peers = [r for f, r in _FAMILIES.items() if f != family and kind_of(f) == kind_of(family)]
    if not peers:
        return None
    med = lambda xs: statistics.median(xs)
    return FamilyEfficiency(
        family, med([r.eta_bw for r in peers]), med([r.eta_c for r in peers]),
        med([r.kernel_s for r in peers]), med([r.step_s for r in peers]),
        med([r.power_frac for r in peers]),
        f"leave-one-family-out: median of {', '.join(r.family for r in peers)}")


def family_efficiency(target: Target) -> FamilyEfficiency:
    """The constants of a target's family; CPUs share one row, unknown GPUs get Hopper's."""
    family = _FAMILY_ALIASES.get(target.family, target.family)
    if _OVERRIDES and family_of(target) in _OVERRIDES and not target.measured:
        return _OVERRIDES[family_of(target)]
    if family in _FAMILIES:
        row = _FAMILIES[family]
        bw_factor, c_factor = part_bandwidth_factor(target), part_compute_factor(target)
        if bw_factor != 1.0:
            row = replace(row, eta_bw=row.eta_bw * bw_factor,
                          evidence=f"{row.evidence}; eta_bw x {bw_factor:.3f} for {target.name} "
                          "(measured read bandwidth share vs the family's part)")
        if c_factor != 1.0:
            row = replace(row, eta_c=row.eta_c * c_factor,
                          evidence=f"{row.evidence}; eta_c x {c_factor:.3f} for {target.name} "
                          "(vendor max-achievable GEMM share vs the family's part)")
        return row
    if target.kind == "cpu" and target.measured:
        # The `local` target's bandwidth is an achieved read rate (torch sum on the runtime's
        # thread count), not a datasheet peak: discounting it again by the catalog's eta_bw
        # would count the same losses twice.
        cpu = _FAMILIES["cpu"]
        return FamilyEfficiency(target.family, 1.0, cpu.eta_c, cpu.kernel_s, cpu.step_s,
                                cpu.power_frac, "measured bandwidth (eta_bw 1); the rest as "
                                "the cpu row: " + cpu.evidence)
    if target.kind == "cpu":
        return _FAMILIES["cpu"]
    base = _FAMILIES["hopper"]
    return FamilyEfficiency(family, base.eta_bw, base.eta_c, base.kernel_s, base.step_s,
                            base.power_frac, f"prior: unknown family '{family}', Hopper's values")


def bandwidth_factor(target: Target, choice: Choice) -> float:
    """Streaming efficiency of a choice's kernel relative to the family's 16-bit eta_bw."""
    info = choice.precision.info
    factor = 1.0
    if info.weight_only and target.kind == "gpu":
        factor *= _WEIGHT_ONLY_BW_FACTOR[info.value_bits]
    kind = choice.sparsity.kind
    if kind == "nm":
        factor *= SPARSE24_BW_FACTOR
    elif kind == "block":
        factor *= BLOCK_BW_FACTOR
    return factor


def baseline_precision(target: Target) -> Precision:
    """The precision of an uncompressed layer: BF16 on GPUs; on CPUs BF16 where the target
    lists a BF16 matrix peak (AMX, AVX512-BF16), else FP32."""
    if target.kind == "cpu" and target.peak("bf16") is None:
        return Precision.FP32
    return Precision.BF16


def all_families() -> dict[str, FamilyEfficiency]:
    """Every documented family row (for reports and docs)."""
    return dict(_FAMILIES)


__all__ = [
    "BLOCK_BW_FACTOR",
    "BLOCK_COMPUTE_EFF",
    "SPARSE24_BW_FACTOR",
    "ComputeFigure",
    "FamilyEfficiency",
    "MathShare",
    "StreamFigure",
    "all_families",
    "all_math_shares",
    "bandwidth_factor",
    "baseline_precision",
    "family_efficiency",
    "family_of",
    "math_efficiency_factor",
    "part_bandwidth_factor",
    "part_compute_factor",
    "replaced_family",
    "transfer_row",
]
