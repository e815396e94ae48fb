"""2:4 sparse GEMM speedup over the dense GEMM as a function of shape, dtype and family.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import bisect
import math

from autoplan.targets import Target

# (family, math dtype) -> ((size, speedup), ...). Ranges in the source ("0.60-0.80x for
# M <= 1024") are entered as their midpoint at both ends of the range.
_TABLES: dict[tuple[str, str], tuple[tuple[int, float], ...]] = {
    ("hopper", "fp8"): ((64, 0.95), (128, 0.93), (256, 0.91), (512, 0.82), (1024, 0.73),
                        (2048, 1.07), (4096, 1.53), (8192, 1.54), (16384, 1.73)),
    ("hopper", "bf16"): ((64, 0.70), (1024, 0.70), (2048, 0.97), (4096, 1.53), (8192, 1.59),
                         (16384, 1.45)),
    ("blackwell", "fp8"): ((64, 0.93), (1024, 0.93), (2048, 1.00), (4096, 1.51), (8192, 1.72),
                           (16384, 1.85)),
    ("ada", "fp8"): ((64, 1.03), (1024, 1.31), (2048, 1.75), (4096, 1.87), (8192, 1.99),
                     (16384, 2.08)),
    ("ampere", "bf16"): ((64, 0.80), (512, 0.80), (1024, 1.19), (4096, 1.71), (8192, 1.52),
                         (16384, 1.22)),
    ("ampere", "int8"): ((64, 1.045), (512, 1.045), (2048, 1.42), (4096, 2.06), (16384, 2.19)),
}

# Where K1 has no row: the closest measured (family, dtype). Hopper INT8 runs the same
# cuSPARSELt tiles as FP8; AMD hipSPARSELt has no published shape sweep, so Hopper BF16 (the
# most conservative large-shape curve) is the prior.
_FALLBACK = {
    ("hopper", "int8"): ("hopper", "fp8"),
    ("blackwell", "bf16"): ("blackwell", "fp8"),
    ("blackwell", "fp4"): ("blackwell", "fp8"),
    ("blackwell", "int8"): ("blackwell", "fp8"),  # K1's B200 INT8 5-6x is flagged anomalous
    ("ada", "bf16"): ("ada", "fp8"),
    ("ada", "int8"): ("ada", "fp8"),
    ("ampere", "int4"): ("ampere", "int8"),
}
_FAMILY_CURVE = {"blackwell-ultra": "blackwell", "cdna3": "hopper", "cdna4": "hopper"}


def _table(family: str, math_dtype: str) -> tuple[tuple[int, float], ...]:
    family = _FAMILY_CURVE.get(family, family)
    key = (family, math_dtype)
    key = key if key in _TABLES else _FALLBACK.get(key, key)
    if key in _TABLES:
        return _TABLES[key]
    # Same family, any dtype; then the Hopper BF16 curve as the conservative default.
    for (fam, _dtype), table in _TABLES.items():
        if fam == family:
            return table
    return _TABLES[("hopper", "bf16")]


def sparse24_speedup(m: int, n: int, k: int, math_dtype: str, target: Target) -> float:
    """Compute-time speedup of a 2:4 GEMM over the dense one (dense time / sparse time).

    Args:
        m: tokens (rows of the activation).
        n: output features.
        k: input features.
        math_dtype: the matmul dtype ("bf16", "fp8", "int8", "fp4", ...).
        target: the hardware; its ``sparse24`` multiplier below 2 (B300 FP4: 1.37x) scales
            the curve down, and a missing entry means no acceleration (1.0).

    Returns:
        The speedup; below 1 for small shapes.
    """
    mult = target.sparse_multiplier(math_dtype)
    if mult <= 1.0:
        return 1.0
    table = _table(target.family, math_dtype)
    size = max(1.0, (float(m) * n * k) ** (1.0 / 3.0))
    logs = [math.log2(s) for s, _ in table]
    x = math.log2(size)
    i = bisect.bisect_left(logs, x)
    if i == 0:
        speed = table[0][1]
    elif i == len(table):
        speed = table[-1][1]
    else:
        (x0, (_, y0)), (x1, (_, y1)) = (logs[i - 1], table[i - 1]), (logs[i], table[i])
        speed = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    # The curves were measured on parts with a 2x sparse peak; a weaker multiplier caps them.
    return speed * min(1.0, mult / 2.0)


__all__ = ["sparse24_speedup"]
