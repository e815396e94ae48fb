"""llama.cpp's GGUF block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4), simulated exactly.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from autoplan.formats.elements import decode_e2m1, decode_e8m0, encode_e2m1
from autoplan.formats.registry import Precision, format_spec, registered_formats
from autoplan.formats.schemes import BlockInt8ActScheme, QParams, Scheme, _amax

BLOCK = 32
MXFP4 = "MXFP4"  # ggml's GGML_TYPE_MXFP4, the GGUF type name of gguf_mxfp4


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF block type.

    Attributes:
        ggml_type: the name in ``gguf.GGMLQuantizationType`` (``Q4_1``).
        bits: bits per stored code (4, 5 or 8).
        has_min: the block stores a minimum (``*_1`` types: asymmetric codes in [0, 2^bits)).
        act_type: the ``vec_dot_type`` llama.cpp quantizes activations to (Q8_0 or Q8_1).
    """

    ggml_type: str
    bits: int
    has_min: bool
    act_type: str

    @property
    def type_size(self) -> int:
        """Bytes per block of 32 values: fp16 d (and m), the high-bit word of Q5, the codes."""
        codes = BLOCK if self.bits == 8 else BLOCK // 2
        return 2 + 2 * self.has_min + (4 if self.bits == 5 else 0) + codes

    @property
    def offset(self) -> int:
        """What a symmetric type subtracts from its stored unsigned code (Q4_0: 8)."""
        return 0 if self.has_min or self.bits == 8 else 1 << (self.bits - 1)


# The FormatSpec.other key: a BlockFormat, or the name of a GGUF type the exporter writes by
# other means (the floats "F16" ..., and MXFP4 from its E2M1 codes and E8M0 scales).
GGUF = "gguf"


def block_format(precision: Precision) -> BlockFormat | None:
    """The GGUF block type of a precision (its FormatSpec's), or None when it is not one."""
    named = format_spec(precision).other.get(GGUF)
    return named if isinstance(named, BlockFormat) else None


def gguf_type_name(precision: Precision) -> str | None:
    """The GGUF tensor type storing a precision (``Q4_1``, ``F16``), or None."""
    named = format_spec(precision).other.get(GGUF)
    return named.ggml_type if isinstance(named, BlockFormat) else named


def gguf_formats() -> dict[Precision, BlockFormat]:
    """Every registered GGUF block type, by precision."""
    return {s.precision: s.other[GGUF] for s in registered_formats()
            if isinstance(s.other.get(GGUF), BlockFormat)}


def roundf(x: Tensor) -> Tensor:
    """C ``roundf`` (half away from zero), as ``gguf.quants.np_roundf`` computes it.

    ``floor(|x| + 0.5)`` would be wrong at 0.49999997 (the sum rounds up to 1.0); the
    integer and fractional parts are handled separately instead.
    """
    a = x.abs()
    floored = torch.floor(a)
    return torch.sign(x) * (floored + torch.floor(2 * (a - floored)))


def block_scales(x: Tensor, fmt: BlockFormat) -> Tensor:
    """Unrounded fp32 ``[..., 1]`` d (``[..., 2]``: d, min for ``*_1``) of blocks ``x [..., 32]``."""
    x = x.float()
    if fmt.has_min:
        mn = x.amin(dim=-1, keepdim=True)
        d = (x.amax(dim=-1, keepdim=True) - mn) / float((1 << fmt.bits) - 1)
        return torch.cat([d, mn], dim=-1)
    if fmt.bits == 8:
        return x.abs().amax(dim=-1, keepdim=True) / 127.0
    signed_max = x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))  # first of equal |x|
    return signed_max / float(-(1 << (fmt.bits - 1)))


def block_codes(x: Tensor, scale: Tensor, fmt: BlockFormat) -> tuple[Tensor, Tensor]:
    """``(dequantized, codes)`` of ``x`` under unrounded scales from ``block_scales``.

    Codes are what the block stores minus the symmetric offset: Q8_0 in [-127, 127], Q4_0 in
    [-8, 7], Q5_0 in [-16, 15], Q4_1 in [0, 15], Q5_1 in [0, 31]. ``x`` may be a whole block
    or a column of one (GPTQ), as long as ``scale`` broadcasts against it.
    """
    x = x.float()
    d = scale[..., :1].float()
    inv = torch.where(d == 0, 0.0, 1.0 / torch.where(d == 0, 1.0, d))
    d16 = d.half().float()
    top = float((1 << fmt.bits) - 1)
    # In-place steps on fresh tensors: each is one fp32 rounding, in gguf.quants' order.
    if fmt.bits == 8:
        q = roundf(x * inv)
        return d16 * q, q
    if fmt.has_min:
        mn = scale[..., 1:2].float()
        q = (x - mn).mul_(inv).add_(0.5).trunc_().clamp_(0.0, top)
        return (d16 * q).add_(mn.half().float()), q
    q = (x * inv).add_(fmt.offset + 0.5).trunc_().clamp_(0.0, top).sub_(fmt.offset)
    return d16 * q, q


class GgufWeightScheme(Scheme):
    """Weights of one GGUF block type for ``quantize_rows`` and GPTQ (groups of 32).

    ``qparams`` returns the unrounded fp32 block parameters (the codes need them) as the
    QParams scale, [..., 1] (d) or [..., 2] (d, min); ``scale_dict`` gives what the block
    stores: ``weight_scale`` (fp16 d, [out, blocks]) and,
    for ``*_1`` types, ``weight_min`` (fp16 m).
    """

    group = BLOCK
    code_dtype = torch.int8

    def __init__(self, fmt: BlockFormat) -> None:
        self.fmt = fmt

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        return QParams(block_scales(slab, self.fmt))

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        return block_codes(x, qp.scale, self.fmt)  # type: ignore[union-attr]

    def scale_dict(self, qp: QParams | None, ctx: Tensor | None) -> dict[str, Tensor]:
        per = 2 if self.fmt.has_min else 1
        scale = qp.scale  # type: ignore[union-attr]
        s = scale.reshape(scale.shape[0], -1, per)
        out = {"weight_scale": s[..., 0].half()}
        if self.fmt.has_min:
            out["weight_min"] = s[..., 1].half()
        return out


class GgufActScheme(BlockInt8ActScheme):
    """Activations as ggml-cpu's ``quantize_row_q8_0`` / ``_q8_1`` round them (see module doc):
    MLAS-like int8 blocks of 32, but the stored scale is fp16."""

    def __init__(self) -> None:
        super().__init__(BLOCK)

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        return QParams(super().qparams(slab, ctx).scale.half())


def ggml_mxfp4_exponent(amax: Tensor) -> Tensor:
    """The E8M0 byte ggml's ``quantize_row_mxfp4_ref`` stores for a block of largest |x| amax.

    ggml computes ``(uint8_t)(floorf(log2f(amax)) - 2 + 127)`` (0 for amax 0): the OCP
    floor rule, but through a float32 ``log2f``, which rounds up to ``k`` for the few floats
    just below ``2**k`` when ``k >= 3`` or ``k <= -2`` (``log2f(0.24999999)`` is -2.0),
    where the exact floor would pick ``k - 1``. glibc's log2f is accurate to well under a float ulp near an
    integer, so ``log2`` in float64 rounded once to float32 gives its result. Exponents below
    the E8M0 range (amax < 2**-125, where ggml's cast of a negative float is undefined) are
    clamped to 0, the byte an all-zero block gets.
    """
    a = amax.float()
    log2f = torch.log2(a.double()).float()  # -inf at 0
    e = torch.floor(log2f) - 2 + 127
    return torch.where(a > 0, e, 0.0).clamp(0, 254).to(torch.uint8)


class GgufMxFp4Scheme(Scheme):
    """Weights in ggml's MXFP4 (``block_mxfp4``: one E8M0 byte and 32 E2M1 codes per block of
    32 along K), bit for bit as ``quantize_row_mxfp4_ref`` makes them.

    The exponent is ``ggml_mxfp4_exponent``. ggml then picks each code as the first of its
    16-entry table ``kvalues_mxfp4`` (0, 1, 2, 3, 4, 6, 8, 12 and their negatives, the E2M1
    values doubled, against half the scale) with the least ``|kv * d - x|``: the nearest
    E2M1 value, saturating at 6, with ties going to the smaller magnitude (2.5 -> 2, 5 -> 4,
    0.75 -> 0.5), not to even as in vLLM's ``mxfp4``, and every zero stored as +0 (code 0,
    which precedes -0 in the table). Near the ties the float differences ggml compares are
    exact (Sterbenz) or on the right side of them, so the real-number rule is its rule.
    Codes are stored as 4-bit E2M1 (sign in bit 3), scales as E8M0 bytes
    (``weight_scale``), the layout ``mxfp4_blocks`` packs.
    """

    group = BLOCK
    code_dtype = torch.uint8

    def qparams(self, slab: Tensor, ctx: Tensor | None) -> QParams:
        return QParams(ggml_mxfp4_exponent(_amax(slab)))

    def fake(self, x: Tensor, qp: QParams | None, ctx: Tensor | None) -> tuple[Tensor, Tensor]:
        s = decode_e8m0(qp.scale)  # type: ignore[union-attr]  # a power of two: x / s exact
        mag = (x.float() / s).abs_().clamp_(max=6.0)
        step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0))
        # round half down: mag / step and the - 0.5 are exact, so ceil lands ties low
        q = mag.div_(step).sub_(0.5).ceil_().mul_(step)
        q = torch.where(q == 0, 0.0, torch.copysign(q, x.float()))  # +0, never -0
        return q * s, q

    def store_codes(self, codes: Tensor) -> Tensor:
        return encode_e2m1(codes)

    def code_values(self, stored: Tensor) -> Tensor:
        return decode_e2m1(stored)


def _act_blocks(x: Tensor) -> tuple[Tensor, Tensor]:
    """fp16 scales [tokens, blocks] and codes [tokens, blocks, 32] of activations x [..., k]."""
    blocks = x.detach().float().reshape(-1, x.shape[-1] // BLOCK, BLOCK)
    scheme = GgufActScheme()
    qp = scheme.qparams(blocks, None)
    _, codes = scheme.fake(blocks, qp, None)
    return qp.scale.squeeze(-1), codes


def q8_1_min_correction(x: Tensor, weight_min: Tensor) -> Tensor:
    """What llama.cpp's ``*_1`` dot adds beyond ``fp16(d) * codes`` activations, [..., out].

    The Q4_1/Q5_1 x Q8_1 dot computes ``sum_b d_w d_a sum(q_w q_a) + m_w * s_a`` with
    ``s_a = fp16(d_a * sum(q_a))`` (d_a unrounded); the simulated product contributes
    ``m_w * fp16(d_a) * sum(q_a)`` instead. Returns ``sum_b m_w (s_a - fp16(d_a) sum(q_a))``.
    """
    blocks = x.detach().float().reshape(-1, x.shape[-1] // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    d = amax / 127.0
    _, codes = _act_blocks(x)
    total = codes.sum(dim=-1)
    delta = (d * total).half().float() - d.half().float() * total
    out = delta @ weight_min.float().t()
    return out.reshape(*x.shape[:-1], weight_min.shape[0])


def pack_blocks(codes: Tensor, scale: Tensor, minimum: Tensor | None,
                fmt: BlockFormat) -> np.ndarray:
    """GGUF bytes [rows, blocks * type_size] of ``codes`` [rows, k] with fp16 scales [rows, blocks].

    Layout (ggml-common.h): ``d`` (``m``) as little-endian fp16, then Q8_0: 32 int8; Q4: 16
    bytes, value j in the low nibble of byte j and value j+16 in the high nibble; Q5: a
    little-endian uint32 whose bit j is bit 4 of value j, then the low nibbles as for Q4.
    """
    rows, k = codes.shape
    nb = k // BLOCK
    q = codes.to(torch.int16).reshape(rows, nb, BLOCK) + fmt.offset
    parts = [scale.to(torch.float16).reshape(rows, nb, 1).numpy().view(np.uint8)]
    if fmt.has_min:
        parts.append(minimum.to(torch.float16).reshape(rows, nb, 1).numpy().view(np.uint8))
    if fmt.bits == 8:
        parts.append(q.to(torch.int8).numpy().view(np.uint8))
    else:
        u = q.to(torch.uint8).numpy()
        if fmt.bits == 5:
            high = (u >> 4).astype(np.uint8)
            parts.append(np.packbits(high, axis=-1, bitorder="little"))
        low = u & np.uint8(0x0F)
        parts.append(low[..., :16] | (low[..., 16:] << np.uint8(4)))
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).reshape(rows, -1))


__all__ = ["BLOCK", "GGUF", "MXFP4", "BlockFormat", "GgufActScheme", "GgufMxFp4Scheme",
           "GgufWeightScheme", "block_codes", "block_format", "block_scales",
           "ggml_mxfp4_exponent", "gguf_formats", "gguf_type_name", "pack_blocks",
           "q8_1_min_correction", "roundf"]
