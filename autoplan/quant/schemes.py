"""Quantization schemes: how each Precision turns a float slab into scales and grid values.

One scheme object answers three questions, and both RTN (whole matrix at once) and GPTQ (one
column at a time) ask them the same way, so the two algorithms cannot disagree on numerics:

* ``prepare(w)``: tensor-level parameters from the whole (already masked) matrix, e.g. the
  NVFP4 FP32 global scale or a per-tensor FP8 scale; ``None`` when there are none.
* ``scale(slab, ctx)``: the *stored* scale of each row of ``slab`` (reducing the last dim,
  keepdim), in its storage dtype (bf16/fp16/fp32, float8_e4m3fn for NVFP4, uint8 E8M0 for
  MXFP4).
* ``fake(x, scale, ctx)``: ``(dequantized values, code values)`` of ``x`` (float32), where
  code values are the integer or low-precision-float codes held exactly in float32.

Choices (documented in docs of quantize_weight too):
* INT4 is symmetric, codes in [-8, 7], scale = amax / 7.5: what compressed-tensors computes
  for symmetric ``pack-quantized`` W4A16 (``amax / ((qmax - qmin) / 2)``), so +amax rounds to
  8 and clamps to 7 while -amax maps to -8. Zero stays exactly zero, which pruning needs.
* INT8 weights are symmetric per channel in [-127, 127] with scale = amax / 127 (vLLM W8A8).
* 16-bit models store INT scales in the model dtype (compressed-tensors does); FP8 scales are
  FP32 (vLLM ``weight_scale``).
* NVFP4 quantizes ``x / (s / g)`` (compressed-tensors) and dequantizes ``(q * s) / g``: q*s is
  exact in FP32 and the GEMM applies 1/g once in its epilogue, as the Blackwell kernels do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from autoplan.formats import Precision
from autoplan.quant.elements import (
    E2M1_EMAX,
    E2M1_MAX,
    E4M3_MAX,
    E5M2_MAX,
    cast_e2m1,
    cast_fp8_e4m3,
    cast_fp8_e5m2,
    decode_e8m0,
    encode_e8m0,
    mx_shared_exponent,
    round_to_bf16,
    round_to_fp16,
)

_F32_EPS = torch.finfo(torch.float32).eps  # compressed-tensors' floor for integer scales
# vLLM's floor for dynamic per-token FP8 scales (min_scaling_factor = 1 / (fmax * 512)).
_FP8_ACT_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)


def _amax(x: Tensor) -> Tensor:
    return x.abs().amax(dim=-1, keepdim=True)


class Scheme:
    """Base: no scales, values pass through unchanged (fp32)."""

    group = 0  # columns sharing one scale; 0 = one scale per row (or per tensor)
    per_tensor = False
    code_dtype: torch.dtype | None = None

    def prepare(self, w: Tensor) -> Tensor | None:
        """Tensor-level parameters computed once from the whole matrix."""
        return None

    def scale(self, slab: Tensor, ctx: Tensor | None) -> Tensor | None:
        """Stored scale per row of ``slab`` (last dim reduced, kept as size 1)."""
        return None

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        """Dequantized values and code values (both float32) of ``x`` under ``scale``."""
        return x, x

    def scale_dict(self, scale: Tensor | None, ctx: Tensor | None) -> dict[str, Tensor]:
        """Named scale tensors as a checkpoint would store them."""
        return {} if scale is None else {"weight_scale": scale}


class RoundScheme(Scheme):
    """Plain 16-bit (or 32-bit) storage: round each value, no scale."""

    def __init__(self, round_fn: Callable[[Tensor], Tensor] | None) -> None:
        self._round = round_fn

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        y = x if self._round is None else self._round(x)
        return y, y


class AbsmaxScheme(Scheme):
    """Scale = amax / ``divisor`` per row (or per tensor), floored at ``min_scale``."""

    divisor = 1.0
    min_scale = _F32_EPS
    scale_dtype = torch.float32

    def _from_amax(self, amax: Tensor) -> Tensor:
        return (amax.float() / self.divisor).clamp(min=self.min_scale).to(self.scale_dtype)

    def prepare(self, w: Tensor) -> Tensor | None:
        return self._from_amax(w.abs().amax().reshape(1)) if self.per_tensor else None

    def scale(self, slab: Tensor, ctx: Tensor | None) -> Tensor:
        if ctx is not None:
            return ctx.expand(*slab.shape[:-1], 1)
        return self._from_amax(_amax(slab))

    def scale_dict(self, scale: Tensor | None, ctx: Tensor | None) -> dict[str, Tensor]:
        return {"weight_scale": ctx if ctx is not None else scale}


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
        min_scale: float = _F32_EPS,
    ) -> None:
        self.qmin, self.qmax, self.divisor = qmin, qmax, divisor
        self.group, self.per_tensor = group, per_tensor
        self.scale_dtype, self.min_scale = scale_dtype, min_scale

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = scale.float()
        q = torch.round(x / s).clamp(self.qmin, self.qmax)  # torch.round is half-to-even
        return q * s, q


class Fp8Scheme(AbsmaxScheme):
    """FP8 values with an FP32 scale = amax / fmax, per row or per tensor; saturating cast."""

    def __init__(
        self, precision: Precision, *, per_tensor: bool = False, min_scale: float = _F32_EPS
    ) -> None:
        e4m3 = precision is Precision.FP8_E4M3
        self.divisor = E4M3_MAX if e4m3 else E5M2_MAX
        self._cast = cast_fp8_e4m3 if e4m3 else cast_fp8_e5m2
        self.code_dtype = torch.float8_e4m3fn if e4m3 else torch.float8_e5m2
        self.per_tensor, self.min_scale = per_tensor, min_scale

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        q = self._cast(x / scale)
        return q * scale, q


def nvfp4_global_scale(amax: Tensor) -> Tensor:
    """NVFP4 FP32 tensor scale ``448 * 6 / amax`` (1 for an all-zero tensor)."""
    a = amax.float().reshape(1)
    return torch.where(a > 0, (E4M3_MAX * E2M1_MAX) / a, torch.ones_like(a))


class NvFp4Scheme(Scheme):
    """NVFP4: E2M1 values, one E4M3 scale per 16 inputs, one FP32 global scale."""

    group = 16
    code_dtype = torch.uint8

    def __init__(self, static_global: Tensor | None = None) -> None:
        self._static = static_global

    def prepare(self, w: Tensor) -> Tensor:
        if self._static is not None:
            return self._static.float().reshape(1)
        return nvfp4_global_scale(w.abs().amax())

    def scale(self, slab: Tensor, ctx: Tensor | None) -> Tensor:
        # (block_amax / 6) * g lies in [0, 448] by construction; cast_fp8 clamps anyway
        # (a static activation global scale can push it over).
        return cast_fp8_e4m3((_amax(slab) / E2M1_MAX) * ctx).to(torch.float8_e4m3fn)

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = scale.float()
        live = s > 0  # a zero E4M3 scale multiplies every code to zero in the kernel
        q = cast_e2m1(torch.where(live, x / torch.where(live, s / ctx, 1.0), 0.0))
        return (q * s) / ctx, q

    def scale_dict(self, scale: Tensor | None, ctx: Tensor | None) -> dict[str, Tensor]:
        return {"weight_scale": scale, "global_scale": ctx}


class MxFp4Scheme(Scheme):
    """MXFP4 (OCP MX v1.0): E2M1 values, one E8M0 power-of-two scale per 32 inputs."""

    group = 32
    code_dtype = torch.uint8

    def scale(self, slab: Tensor, ctx: Tensor | None) -> Tensor:
        return encode_e8m0(mx_shared_exponent(_amax(slab), E2M1_EMAX))

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = decode_e8m0(scale)  # a power of two: x / s and q * s are exact (barring subnormals)
        q = cast_e2m1(x / s)
        return q * s, q


class BlockInt8ActScheme(AbsmaxScheme):
    """Activations as ONNX Runtime's MatMulNBits rounds them at accuracy_level 4.

    MLAS ``QuantizeARow_CompInt8``: per block of ``group`` values along K, stored scale
    ``amax / 127`` (FP32) and codes ``round_half_even(x * (127 / amax))`` -- the reciprocal is
    computed from amax in one division, not as ``1 / scale``, which can differ by one ULP and
    flip a code at a half-integer. An all-zero block gets scale 0 and codes 0.
    """

    code_dtype = torch.int8
    divisor = 127.0

    def __init__(self, group: int) -> None:
        self.group = group

    def scale(self, slab: Tensor, ctx: Tensor | None) -> Tensor:
        return _amax(slab).float() / self.divisor

    def fake(self, x: Tensor, scale: Tensor | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        amax = _amax(x).float()
        live = amax > 0
        inv = torch.where(live, self.divisor / torch.where(live, amax, 1.0), 0.0)
        q = torch.round(x * inv)  # |x * inv| <= 127 (+1 ulp), so no clamp is needed
        return q * scale.float(), q


def quantize_rows(
    x: Tensor, scheme: Scheme, ctx: Tensor | None, scale: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Round-to-nearest quantization of a 2-D float32 ``x`` [rows, n], fully vectorized.

    Groups run along the last dim; a ragged last group is zero-padded (zeros never change an
    absmax) and the padding is cut off again, so any ``n`` works.

    Returns:
        ``(dequant [rows, n], code values [rows, n], stored scale)``, the scale shaped
        [rows, n_groups] for grouped schemes and [rows, 1] otherwise. A given ``scale``
        (e.g. a static activation scale) is used instead of computing one.
    """
    rows, n = x.shape
    g = scheme.group
    if not g:
        s = scheme.scale(x, ctx) if scale is None else scale
        deq, codes = scheme.fake(x, s, ctx)
        return deq, codes, s
    pad = (-n) % g
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    slab = xp.reshape(rows, -1, g)
    s = scheme.scale(slab, ctx) if scale is None else scale.reshape(rows, -1, 1)
    deq, codes = scheme.fake(slab, s, ctx)
    return deq.reshape(rows, -1)[:, :n], codes.reshape(rows, -1)[:, :n], s.reshape(rows, -1)


def _gguf_format(precision: Precision):  # noqa: ANN202 - BlockFormat | None, imported lazily
    # gguf_blocks builds on this module's Scheme classes, so it is imported on use.
    from autoplan.quant.gguf_blocks import block_format

    return block_format(precision)


def weight_scheme(precision: Precision, dtype: torch.dtype, *, per_channel: bool = True) -> Scheme:
    """The scheme that stores weights of ``dtype`` in ``precision``."""
    scale_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32
    p = precision
    gguf = _gguf_format(p)
    if gguf is not None:
        from autoplan.quant.gguf_blocks import GgufWeightScheme

        return GgufWeightScheme(gguf)
    if p is Precision.FP32:
        return RoundScheme(None)
    if p is Precision.BF16:
        return RoundScheme(round_to_bf16)
    if p is Precision.FP16:
        return RoundScheme(round_to_fp16)
    if p in (Precision.FP8_E4M3, Precision.FP8_E5M2):
        return Fp8Scheme(p, per_tensor=not per_channel)
    if p in (Precision.INT8, Precision.INT8_WO, Precision.INT8A8_G128):
        return IntScheme(-127, 127, 127.0, per_tensor=not per_channel, scale_dtype=scale_dtype)
    if p in (Precision.INT4_G32, Precision.INT4_G64, Precision.INT4_G128, Precision.INT4A8_G32,
             Precision.INT4A8_G64, Precision.INT4A8_G128):
        return IntScheme(-8, 7, 7.5, group=p.info.group, scale_dtype=scale_dtype)
    if p is Precision.NVFP4:
        return NvFp4Scheme()
    if p is Precision.MXFP4:
        return MxFp4Scheme()
    raise NotImplementedError(f"no weight scheme for {p.value}")  # pragma: no cover


def activation_scheme(precision: Precision, static_scale: Tensor | None = None) -> Scheme:
    """The scheme that fake-quantizes activations, one row per token.

    Weight-only and fp32 precisions pass activations through; bf16/fp16 round. W8A8 formats
    scale per token dynamically (or by ``static_scale`` per tensor); NVFP4 uses
    ``static_scale`` as its FP32 global scale when given, else one from this tensor's amax.
    """
    p = precision
    if p is Precision.BF16:
        return RoundScheme(round_to_bf16)
    if p is Precision.FP16:
        return RoundScheme(round_to_fp16)
    if p.info.weight_only or p is Precision.FP32:
        return RoundScheme(None)
    if _gguf_format(p) is not None:
        from autoplan.quant.gguf_blocks import GgufActScheme

        return GgufActScheme()
    if p.info.act_group:
        return BlockInt8ActScheme(p.info.act_group)
    if p in (Precision.FP8_E4M3, Precision.FP8_E5M2):
        return Fp8Scheme(p, min_scale=_FP8_ACT_MIN_SCALE)
    if p is Precision.INT8:
        # vLLM clamps activation codes to the full int8 range; dynamic scales never reach -128.
        return IntScheme(-128, 127, 127.0)
    if p is Precision.NVFP4:
        return NvFp4Scheme(static_scale)
    if p is Precision.MXFP4:
        return MxFp4Scheme()
    raise NotImplementedError(f"no activation scheme for {p.value}")  # pragma: no cover


__all__ = [
    "AbsmaxScheme",
    "BlockInt8ActScheme",
    "Fp8Scheme",
    "IntScheme",
    "MxFp4Scheme",
    "NvFp4Scheme",
    "RoundScheme",
    "Scheme",
    "activation_scheme",
    "nvfp4_global_scale",
    "quantize_rows",
    "weight_scheme",
]
