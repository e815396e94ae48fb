"""GEMM kernel paths whose published timings depart from the family's BF16/FP8 kernels.

The family constants (efficiency.py) describe the well-tuned BF16/FP8 GEMM kernels of a
hardware family. A format served by a different, less mature kernel gets its own path here:
its streaming and math efficiencies and its fixed time per call, set from KERNEL-LEVEL
timings (GEMM microbenchmarks), never from the end-to-end validation points.

NVFP4/MXFP4 on Blackwell (the only path so far). Two B200 GEMM timings at M = 1 and one at
large M, from benchmarks that are not validation points:
  [VLLM-20578] vLLM `bench_nvfp4_gemm.py` on B200 (2025-07-07), CUTLASS NVFP4 GEMM without
      the activation quantization ("nvfp4-noquant"), Llama-3.1-8B N=6144 K=4096:
      4.44 TFLOP/s at M = 1 (11.34 us), ~11.3-11.8 us flat up to M = 512, 3,904 TFLOP/s at
      M = 16,384 (211.2 us). On the same GPU and shape, torch BF16 runs 8.5 us at M = 1.
  [FI-1732] FlashInfer 0.3.1 `mm_fp4` CUTLASS backend (TensorRT-LLM's FP4 GEMM) on B200
      (2025-09-19), M = 1, N = K = 8192: "1.78 TB/s" on the 0.5-byte weights (18.85 us),
      "for fp16 matmul of the same size we could achieve 5-6 TB/s".
With this model's byte count (4.5 bits per weight + activations + 16-bit outputs):
  t = fixed_s + max(bytes / (eta_bw * BW), flops / (eta_c * peak_fp4))
  the two M = 1 points give eta_bw = 0.41 (3.14 TB/s of 7.7) and fixed_s = 6.8 us; the
  M = 16,384 point then gives eta_c = 0.45 of the 9,000 TFLOP/s dense FP4 peak.
  The three constants reproduce every other row of the vLLM table within +17 % (M = 512)
  and mostly within +8 % (tests/unit/test_cost_kernels.py). The family's own BF16/FP8 row
  (eta_bw 0.70, eta_c 0.65, kernel_s 3 us) would predict the FP4 kernel 1.9-2.0x faster at
  M <= 128 and 1.5x faster at large M.
These are the 2025 kernels the published end-to-end figures ran with; newer FP4 GEMMs
(CuTe DSL, 2026) are faster and would need a newer table. B300 (blackwell-ultra) has no
table of its own: it is assumed to run the same kernels (prior).
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
