"""Quantization schemes: how a number format turns a float slab into codes and scales.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from autoplan.formats.elements import (
    E2M1_EMAX,
    E2M1_MAX,
    E4M3_MAX,
    E5M2_MAX,
    cast_e2m1,
    cast_fp8_e4m3,
    cast_fp8_e5m2,
    decode_e2m1,
    decode_e8m0,
    encode_e2m1,
    encode_e8m0,
    mx_shared_exponent,
)

# vLLM's floor for dynamic per-token FP8 scales (min_scaling_factor = 1 / (fmax * 512)).
FP8_ACT_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)


def _amax(x: Tensor) -> Tensor:
    """max |x| along the last dim (keepdim), the same bits as ``x.abs().amax(...)``.

    Taken as max(max x, -min x) from two reductions instead of a full-size ``abs`` copy,
    about 4x faster on a weight matrix; the final ``abs`` turns the ``-0.0`` an all-zero row
    can give into the ``+0.0`` of the plain formula, and NaN still propagates.
    """
    return torch.maximum(x.amax(dim=-1, keepdim=True), -x.amin(dim=-1, keepdim=True)).abs()


def scale_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Integer scales are stored in a 16-bit model's dtype (compressed-tensors), else FP32."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


@dataclass(frozen=True)
class QParams:
    """The stored quantization parameters of some rows: scale, and zero point if asymmetric.

    Shapes follow the slab they were computed from with its last dim reduced to 1 (or, once
    ``quantize_rows`` flattens them, [rows, groups]).
    """

    scale: Tensor
    zero_point: Tensor | None = None

    def reshape(self, *shape: int) -> QParams:
        zp = None if self.zero_point is None else self.zero_point.reshape(*shape)
        return QParams(self.scale.reshape(*shape), zp)

    def expand(self, *shape: int) -> QParams:
        zp = None if self.zero_point is None else self.zero_point.expand(*shape)
        return QParams(self.scale.expand(*shape), zp)

    @staticmethod
    def cat(parts: list[QParams], dim: int) -> QParams:
        """Concatenate per-group parameters (GPTQ computes them one group at a time)."""
        zps = [p.zero_point for p in parts]
        zp = None if zps[0] is None else torch.cat(zps, dim=dim)  # type: ignore[arg-type]
        return QParams(torch.cat([p.scale for p in parts], dim=dim), zp)


class Scheme:
    """Base: no scales, values pass through unchanged (fp32)."""

    group = 0  # columns sharing one scale; 0 = one scale per row (or per tensor)
    per_tensor = False
    code_dtype: torch.dtype | None = None

    def prepare(self, w: Tensor) -> Tensor | None:
        """Tensor-level parameters computed once from the whole matrix."""
        return None

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams | None:
        """Stored parameters per row of ``slab`` (last dim reduced, kept as size 1)."""
        return None

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        """Dequantized values and code values (both float32) of ``x`` under ``qp``."""
        return x, x

    def store_codes(self, codes: Tensor) -> Tensor | None:
        """Code values (float32) as the format stores them (``code_dtype``), or None."""
        return None if self.code_dtype is None else codes.to(self.code_dtype)

    def code_values(self, stored: Tensor) -> Tensor:
        """The float32 code values of stored codes: the inverse of ``store_codes``."""
        return stored.float()

    def scale_dict(self, qp: QParams | None, ctx: Tensor | None) -> dict[str, Tensor]:
        """Named parameter tensors as a compressed-tensors checkpoint names them."""
        return {} if qp is None else {"weight_scale": qp.scale}


class RoundScheme(Scheme):
    """Plain 16-bit (or 32-bit) storage: round each value, no scale."""

    def __init__(self, round_fn: Callable[[Tensor], Tensor] | None) -> None:
        self._round = round_fn

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        y = x if self._round is None else self._round(x)
        return y, y


class AbsmaxScheme(Scheme):
    """Scale = amax / ``divisor`` per row (or per tensor).

    With ``min_scale`` None (weights), a scale that is exactly 0 in its storage dtype becomes
    that dtype's eps and any other scale is kept, however small: compressed-tensors 0.20's
    ``calculate_qparams`` (step 5, ``_get_dtype_eps``). Flooring every scale at fp32 eps,
    as older releases did, coarsened groups whose amax is below ~1e-6. A ``min_scale``
    clamps instead (vLLM's floor for dynamic per-token FP8 activations).
    """

    divisor = 1.0
    min_scale: float | None = None
    scale_dtype = torch.float32

    def _from_amax(self, amax: Tensor) -> Tensor:
        s = amax.float() / self.divisor
        if self.min_scale is not None:
            return s.clamp(min=self.min_scale).to(self.scale_dtype)
        s = s.to(self.scale_dtype)
        return torch.where(s == 0, torch.finfo(self.scale_dtype).eps, s).to(self.scale_dtype)

    def prepare(self, w: Tensor) -> Tensor | None:
        return self._from_amax(w.abs().amax().reshape(1)) if self.per_tensor else None

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        if ctx is not None:
            return QParams(ctx.expand(*slab.shape[:-1], 1))
        return QParams(self._from_amax(_amax(slab)))

    def scale_dict(self, qp: QParams | None, ctx: Tensor | None) -> dict[str, Tensor]:
        return {"weight_scale": ctx if ctx is not None else qp.scale}  # type: ignore[union-attr]


class IntScheme(AbsmaxScheme):
    """Symmetric integer codes in [qmin, qmax] with scale = amax / divisor, RNE rounding."""

    code_dtype = torch.int8

    def __init__(
        self,
        qmin: int,
        qmax: int,
        divisor: float,
        *,
        group: int = 0,
        per_tensor: bool = False,
        scale_dtype: torch.dtype = torch.float32,
        min_scale: float | None = None,
    ) -> None:
        self.qmin, self.qmax, self.divisor = qmin, qmax, divisor
        self.group, self.per_tensor = group, per_tensor
        self.scale_dtype, self.min_scale = scale_dtype, min_scale

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = qp.scale.float()  # type: ignore[union-attr]
        q = x / s  # rounded and clamped in place: the same bits, two full-size copies fewer
        q.round_().clamp_(self.qmin, self.qmax)  # torch.round is half-to-even
        return q * s, q


class AsymIntScheme(Scheme):
    """Asymmetric ``bits``-bit integers per group: compressed-tensors' ``calculate_qparams``.

    Parameters are computed in ``scale_dtype`` with the library's own operations and order
    (so a bf16 model's scale is ``bf16(bf16(max - min) / 15)``); an all-zero group, where the
    library divides 0 by 0, gets the smallest zero point and a scale of the dtype's eps, so
    its codes dequantize to exact zeros. Codes and zero points are stored unsigned
    (``+ 2**(bits-1)``: 0..15 for 4 bits), the layout of MatMulNBits and of vLLM's ``uint4``.
    """

    code_dtype = torch.uint8

    def __init__(self, bits: int, group: int, *, scale_dtype: torch.dtype = torch.float32) -> None:
        self.group, self.scale_dtype = group, scale_dtype
        self.offset = 1 << (bits - 1)
        self.qmin, self.qmax = -self.offset, self.offset - 1

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        dt = self.scale_dtype
        lo = slab.amin(dim=-1, keepdim=True).to(dt).clamp(max=0)
        hi = slab.amax(dim=-1, keepdim=True).to(dt).clamp(min=0)
        # the library divides by a 0-dim tensor of the same dtype; so do we, to round alike
        scale = (hi - lo) / torch.tensor(float(self.qmax - self.qmin), dtype=dt)
        empty = scale == 0
        zp = (self.qmin - lo / torch.where(empty, 1.0, scale).to(dt)).clamp(self.qmin, self.qmax)
        zp = torch.where(empty, float(self.qmin), zp.float())
        scale = torch.where(empty, torch.finfo(dt).eps, scale.float()).to(dt)
        return QParams(scale, (torch.round(zp) + self.offset).to(torch.uint8))

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = qp.scale.float()  # type: ignore[union-attr]
        zp = qp.zero_point.float()  # type: ignore[union-attr]
        signed = torch.round((x / s + (zp - self.offset)).clamp(self.qmin, self.qmax))
        codes = signed + self.offset
        return (codes - zp) * s, codes

    def scale_dict(self, qp: QParams | None, ctx: Tensor | None) -> dict[str, Tensor]:
        zp = qp.zero_point  # type: ignore[union-attr]  # asymmetric params always have one
        return {"weight_scale": qp.scale, "weight_zero_point": zp}  # type: ignore[union-attr]


class Fp8Scheme(AbsmaxScheme):
    """FP8 values with an FP32 scale = amax / fmax, per row or per tensor; saturating cast."""

    def __init__(
        self, *, e4m3: bool = True, per_tensor: bool = False, min_scale: float | None = None
    ) -> None:
        self.divisor = E4M3_MAX if e4m3 else E5M2_MAX
        self._cast = cast_fp8_e4m3 if e4m3 else cast_fp8_e5m2
        self.code_dtype = torch.float8_e4m3fn if e4m3 else torch.float8_e5m2
        self.per_tensor, self.min_scale = per_tensor, min_scale

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        scale = qp.scale  # type: ignore[union-attr]
        q = self._cast(x / scale)
        return q * scale, q


class Fp8BlockScheme(Fp8Scheme):
    """FP8 E4M3 weights with one FP32 scale per ``rows`` x ``group`` block (DeepSeek-V3's
    128 x 128): compressed-tensors' ``QuantizationStrategy.BLOCK``.

    A block's scale is ``amax / 448`` over the whole tile, ``torch.finfo(float32).eps``
    when the tile is all zeros (``calculate_qparams`` on the tile's min/max). The slab
    handed to ``qparams`` always holds every row of the matrix (RTN's [rows, groups,
    group], GPTQ's [rows, group]), so the tile reduction runs along dim 0 and each row
    gets its tile's scale; ``scale_dict`` stores one per tile, [ceil(rows / 128),
    ceil(cols / 128)], the layout of the checkpoint's ``weight_scale`` (vLLM's
    ``BlockQuantScaleParameter``). A ragged last tile reduces over the rows it has, as
    the library's zero padding does.
    """

    def __init__(self, rows: int = 128, group: int = 128) -> None:
        super().__init__(e4m3=True)
        self.rows, self.group = rows, group

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        amax = _amax(slab).float()
        n = amax.shape[0]
        pad = (-n) % self.rows
        if pad:
            amax = torch.cat([amax, amax.new_zeros(pad, *amax.shape[1:])])
        tiles = amax.reshape(-1, self.rows, *amax.shape[1:]).amax(dim=1)
        return QParams(self._from_amax(tiles).repeat_interleave(self.rows, dim=0)[:n])

    def scale_dict(self, qp: QParams | None, ctx: Tensor | None) -> dict[str, Tensor]:
        return {"weight_scale": qp.scale[:: self.rows].contiguous()}  # type: ignore[union-attr]


class Fp8TokenGroupActScheme(Scheme):
    """Dynamic FP8 E4M3 activations per token per ``group`` inputs along K, as vLLM runs them
    for block-quantized weights (``per_token_group_quant_fp8``).

    vLLM csrc/quantization/w8a8/fp8/per_token_group_quant.cu (the CUDA kernel
    ``per_token_group_quant_fp8`` prefers; its Triton fallback computes the same): in
    float32, ``absmax = max(eps, max|x|)`` with ``eps = 1e-10``, ``scale = absmax / 448``,
    ``q = fp8(clamp(x / scale, -448, 448))`` (a division, not a reciprocal multiply; the
    cast rounds to nearest even). So an all-zero group gets scale ``1e-10 / 448`` and zero
    codes. compressed-tensors' GROUP dynamic fake quantization agrees wherever amax >= 1e-10
    and the input is fp32. vLLM's torch-native fallback (``QuantFP8._quantize_group_native``,
    used when the custom op is disabled under torch.compile) floors the *scale* at
    1 / (448 * 512) instead, so it rounds groups whose amax is below 1/512 differently;
    DeepGEMM's UE8M0 mode (power-of-two scales, Blackwell) is another format again.
    """

    code_dtype = torch.float8_e4m3fn
    eps = 1e-10

    def __init__(self, group: int = 128) -> None:
        self.group = group

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        return QParams(_amax(slab).float().clamp(min=self.eps) / E4M3_MAX)

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        scale = qp.scale  # type: ignore[union-attr]
        q = cast_fp8_e4m3(x / scale)
        return q * scale, q


def nvfp4_global_scale(amax: Tensor) -> Tensor:
    """NVFP4 FP32 tensor scale ``448 * 6 / amax``, as compressed-tensors' ``generate_gparam``.

    compressed-tensors 0.20 (quantization/utils/helpers.py): amax is clamped to the smallest
    normal fp32 and a quotient that overflows (amax < 448 * 6 / fp32 max, about 7.9e-36,
    including an all-zero tensor) or is NaN becomes 1.0, so a tiny tensor never gets an inf
    global scale whose blocks would then dequantize to NaN.
    """
    a = amax.float().reshape(1).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.nan_to_num((E4M3_MAX * E2M1_MAX) / a, nan=1.0, posinf=1.0, neginf=1.0)


class NvFp4Scheme(Scheme):
    """NVFP4: E2M1 values, one E4M3 scale per 16 inputs, one FP32 global scale."""

    group = 16
    code_dtype = torch.uint8

    def __init__(self, static_global: Tensor | None = None, *, zero_scale: float = 0.0) -> None:
        self._static = static_global
        # compressed-tensors stores a block scale that rounds to 0 in E4M3 as 0.125 (its
        # ``_get_dtype_eps`` for E4M3), so weights use 0.125; the activation kernels keep 0.
        # Either way the block's codes are 0 (|x| / (s / g) < 0.05 rounds to 0 in E2M1).
        self.zero_scale = zero_scale

    def prepare(self, w: Tensor) -> Tensor:
        if self._static is not None:
            return self._static.float().reshape(1)
        return nvfp4_global_scale(w.abs().amax())

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        # (block_amax / 6) * g lies in [0, 448] by construction; cast_fp8 clamps anyway
        # (a static activation global scale can push it over).
        s = cast_fp8_e4m3((_amax(slab) / E2M1_MAX) * ctx)
        if self.zero_scale:
            s = torch.where(s == 0, self.zero_scale, s)
        return QParams(s.to(torch.float8_e4m3fn))

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = qp.scale.float()  # type: ignore[union-attr]
        live = s > 0  # a zero E4M3 scale multiplies every code to zero in the kernel
        q = cast_e2m1(torch.where(live, x / torch.where(live, s / ctx, 1.0), 0.0))
        return (q * s) / ctx, q

    def store_codes(self, codes: Tensor) -> Tensor:
        return encode_e2m1(codes)

    def code_values(self, stored: Tensor) -> Tensor:
        return decode_e2m1(stored)

    def scale_dict(self, qp: QParams | None, ctx: Tensor | None) -> dict[str, Tensor]:
        return {"weight_scale": qp.scale, "global_scale": ctx}  # type: ignore[union-attr,dict-item]


class MxFp4Scheme(Scheme):
    """MXFP4: E2M1 values, one E8M0 power-of-two scale per 32 inputs, as vLLM runs it.

    The runtime simulated is vLLM (and SGLang, which reuses its kernels): the block scale is
    compressed-tensors' / vLLM's "even" rounding (``mx_shared_exponent(rounding="even")``),
    not the OCP spec's floor, because that is what the checkpoints vLLM loads hold and what
    its MXFP4 activation quantization computes. ``rounding="floor"`` simulates a runtime
    that follows the OCP MX spec instead.
    """

    group = 32
    code_dtype = torch.uint8

    def __init__(self, rounding: str = "even") -> None:
        self.rounding = rounding

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        exponent = mx_shared_exponent(_amax(slab), E2M1_EMAX, rounding=self.rounding)
        return QParams(encode_e8m0(exponent))

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = decode_e8m0(qp.scale)  # type: ignore[union-attr]  # a power of two: exact x / s, q * s
        q = cast_e2m1(x / s)
        return q * s, q

    def store_codes(self, codes: Tensor) -> Tensor:
        return encode_e2m1(codes)

    def code_values(self, stored: Tensor) -> Tensor:
        return decode_e2m1(stored)


class _ReciprocalInt8ActScheme(AbsmaxScheme):
    """Dynamic int8 activations rounded as ``round_half_even(x * (127 / amax))``.

    The stored scale is ``amax / 127`` (FP32); the codes multiply by the reciprocal computed
    from amax in one division, not by ``1 / scale`` and not as ``x / scale``: either can
    differ by one ULP and flip a code at a half-integer. An all-zero row or block gets scale
    0 and codes 0 (the kernels' ``0 * inf`` is NaN, which their saturating convert maps to 0).
    """

    code_dtype = torch.int8
    divisor = 127.0

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        return QParams(_amax(slab).float() / self.divisor)

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        amax = _amax(x).float()
        live = amax > 0
        inv = torch.where(live, self.divisor / torch.where(live, amax, 1.0), 0.0)
        # |x * inv| <= 127 (+1 ulp); the clamp is the kernels' saturation, for an amax so
        # small that 127 / amax overflows to inf
        q = torch.round(x * inv).nan_to_num(0.0).clamp(-128, 127)
        return q * qp.scale.float(), q  # type: ignore[union-attr]


class BlockInt8ActScheme(_ReciprocalInt8ActScheme):
    """Activations as ONNX Runtime's MatMulNBits rounds them at accuracy_level 4.

    MLAS ``QuantizeARow_CompInt8``: per block of ``group`` values along K, stored scale
    ``amax / 127`` and codes ``round_half_even(x * (127 / amax))``.
    """

    def __init__(self, group: int) -> None:
        self.group = group


class TokenInt8ActScheme(_ReciprocalInt8ActScheme):
    """Dynamic per-token INT8 activations of vLLM's W8A8 (``dynamic_scaled_int8_quant``).

    vLLM csrc/quantization/compressed_tensors/int8_quant_kernels.cu: per token,
    ``scale = absmax / 127.0f`` and ``out = float_to_int8_rn(x * (127.0f / absmax))``
    (``cvt.rni.sat.s8.f32``: round half to even, saturate to [-128, 127], NaN -> 0).
    A static per-tensor scale is vLLM's other kernel, ``x / scale``: ``IntScheme``.
    """

    group = 0


def quantize_rows(
    x: Tensor, scheme: Scheme, ctx: Tensor | None, params: QParams | None = None
) -> tuple[Tensor, Tensor, QParams | None]:
    """Round-to-nearest quantization of a 2-D float32 ``x`` [rows, n], fully vectorized.

    Groups run along the last dim; a ragged last group is zero-padded (zeros never change an
    absmax, a min <= 0 or a max >= 0) and the padding is cut off again, so any ``n`` works.

    Returns:
        ``(dequant [rows, n], code values [rows, n], stored QParams)``, the parameters shaped
        [rows, n_groups] for grouped schemes and [rows, 1] otherwise. Given ``params`` (e.g.
        a static activation scale) are used instead of computing them.
    """
    rows, n = x.shape
    g = scheme.group
    if not g:
        qp = scheme.qparams(x, ctx) if params is None else params
        deq, codes = scheme.fake(x, qp, ctx)
        return deq, codes, qp
    pad = (-n) % g
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    slab = xp.reshape(rows, -1, g)
    qp = scheme.qparams(slab, ctx) if params is None else params.reshape(rows, -1, 1)
    deq, codes = scheme.fake(slab, qp, ctx)
    flat = None if qp is None else qp.reshape(rows, -1)
    return deq.reshape(rows, -1)[:, :n], codes.reshape(rows, -1)[:, :n], flat


__all__ = [
    "FP8_ACT_MIN_SCALE",
    "AbsmaxScheme",
    "AsymIntScheme",
    "BlockInt8ActScheme",
    "Fp8BlockScheme",
    "Fp8Scheme",
    "Fp8TokenGroupActScheme",
    "IntScheme",
    "MxFp4Scheme",
    "NvFp4Scheme",
    "QParams",
    "RoundScheme",
    "Scheme",
    "TokenInt8ActScheme",
    "nvfp4_global_scale",
    "quantize_rows",
    "scale_dtype_for",
]
