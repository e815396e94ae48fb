"""Element formats, bit-exact: rounding onto FP8, E2M1 and 16-bit grids, and E8M0 scales.

Every ``cast_*`` function rounds to nearest, ties to even, onto the format's grid and
returns the *values* in the input's floating dtype (fake quantization), so callers can keep
computing in float32. Casts saturate to the format's largest finite value, as the
quantization kernels of vLLM, TensorRT-LLM and compressed-tensors do, rather than producing
NaN (E4M3) or inf (E5M2). The integer codes come from ``encode_*`` or from a plain
``.to(torch.float8_*)`` of already-rounded values, which is then exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of E2M1's largest power of two (4 = 2**2), OCP MX spec table 1
E8M0_BIAS = 127
E8M0_NAN = 0xFF

# Magnitudes of the eight non-negative E2M1 codes 0b000..0b111.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _saturating_cast(x: Tensor, dtype: torch.dtype, fmax: float) -> Tensor:
    # Clamp first: torch's float8 casts are not guaranteed to saturate, and serving kernels
    # clamp to +-max before converting. NaN survives clamp and the cast.
    y = x.float().clamp(-fmax, fmax)
    out = x.dtype if x.is_floating_point() else torch.float32
    if out is torch.float32:  # the rounded values back into the clamped copy: one copy fewer
        return y.copy_(y.to(dtype))
    return y.to(dtype).to(out)  # straight from fp8 (a NaN keeps the payload it always had)


def cast_fp8_e4m3(x: Tensor) -> Tensor:
    """Round to the FP8 E4M3 (``e4m3fn``: no inf, max 448, subnormals) grid, saturating."""
    return _saturating_cast(x, torch.float8_e4m3fn, E4M3_MAX)


def cast_fp8_e5m2(x: Tensor) -> Tensor:
    """Round to the FP8 E5M2 (IEEE-like, max 57344) grid, saturating instead of inf."""
    return _saturating_cast(x, torch.float8_e5m2, E5M2_MAX)


def round_to_bf16(x: Tensor) -> Tensor:
    """Round to bfloat16 (RNE) and return in the input dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def round_to_fp16(x: Tensor) -> Tensor:
    """Round to IEEE float16 (RNE) and return in the input dtype; overflow gives inf as in fp16."""
    return x.to(torch.float16).to(x.dtype)


def cast_e2m1(x: Tensor) -> Tensor:
    """Round to the FP4 E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign, RNE, saturating at 6.

    E2M1 spacing is 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]. Dividing by the spacing (a power
    of two, so exact) and applying torch.round (round-half-even) lands ties on the even
    mantissa: 2.5 -> 2, 3.5 -> 4, 5 -> 4, 0.25 -> 0, 0.75 -> 1. At a binade edge the quotient
    rounds up onto the next binade's first value, which is what the format does too.
    """
    xf = x.float()
    mag = xf.abs().clamp(max=E2M1_MAX)
    step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0))
    q = torch.round(mag / step) * step
    return torch.copysign(q, xf).to(x.dtype if x.is_floating_point() else torch.float32)


def encode_e2m1(values: Tensor) -> Tensor:
    """4-bit E2M1 codes (sign in bit 3), one per uint8, of values already on the E2M1 grid."""
    v = values.float()
    mag = v.abs()
    # 0, .5, 1, 1.5, 2 -> 0..4 (2*mag); 3, 4 -> 5, 6 (mag + 2); 6 -> 7
    idx = torch.where(mag <= 2.0, mag * 2, torch.where(mag <= 4.0, mag + 2, 7.0))
    sign = torch.signbit(v).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def decode_e2m1(codes: Tensor) -> Tensor:
    """Float32 values of 4-bit E2M1 codes (the low nibble of each uint8)."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32,
                         device=codes.device)
    return table[(codes & 0xF).long()]


def mx_shared_exponent(amax: Tensor, emax_elem: int = E2M1_EMAX, *, rounding: str = "floor"
                       ) -> Tensor:
    """MX shared exponent of a block's ``amax``, as float32 (NaN if not finite).

    ``rounding="floor"`` is the OCP MX v1.0 spec: ``floor(log2(amax)) - emax_elem``.
    ``rounding="even"`` is what compressed-tensors (``generate_mxfp4_scales``) and vLLM's MXFP4
    reference (``qdq_mxfp4_torch``, ``scale_calculation_mode="even"``) compute, and so what a
    checkpoint vLLM loads holds: amax is first rounded to a power of two by adding half an
    E2M1 ulp to its mantissa bits and truncating, i.e. up to the next power of two when its
    mantissa is >= 1.75 (values the floor scale would saturate at 6 then land on 4 of the
    next binade). frexp gives the exponent and mantissa exactly; ``log2`` in float can round
    a value just below a power of two up to it and pick the wrong binade. A zero block gives
    -inf, which the E8M0 encoding clamps to its smallest scale 2**-127.
    """
    if rounding not in ("floor", "even"):
        raise ValueError(f"rounding must be 'floor' or 'even', got {rounding!r}")
    a = amax.float()
    mant, exp = torch.frexp(a)  # a = mant * 2**exp, mant in [0.5, 1)
    e = (exp - 1).float() - emax_elem
    if rounding == "even":
        e = e + (mant.abs() >= 0.875).float()  # mantissa 1.75 in [1, 2) is 0.875 in [0.5, 1)
    e = torch.where(a == 0, torch.full_like(e, float("-inf")), e)
    return torch.where(torch.isfinite(a), e, torch.full_like(e, float("nan")))


def encode_e8m0(exponent: Tensor) -> Tensor:
    """E8M0 codes (uint8) of power-of-two exponents: clamp to [-127, 127], bias 127, NaN -> 0xFF."""
    e = exponent.float()
    code = (e.clamp(-E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS).nan_to_num(E8M0_NAN)
    return code.to(torch.uint8)


def decode_e8m0(codes: Tensor) -> Tensor:
    """Float32 scales ``2**(code - 127)`` of E8M0 codes; 0xFF decodes to NaN."""
    c = codes.to(torch.int32)
    scale = torch.exp2((c - E8M0_BIAS).float())
    return torch.where(c == E8M0_NAN, torch.full_like(scale, float("nan")), scale)


__all__ = [
    "E2M1_EMAX",
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E5M2_MAX",
    "E8M0_BIAS",
    "E8M0_NAN",
    "cast_e2m1",
    "cast_fp8_e4m3",
    "cast_fp8_e5m2",
    "decode_e2m1",
    "decode_e8m0",
    "encode_e2m1",
    "encode_e8m0",
    "mx_shared_exponent",
    "round_to_bf16",
    "round_to_fp16",
]
