"""NVIDIA linear-layer kernels for the choices autoplan plans: 2:4, FP8 (W8A8), 2:4 FP8, NVFP4.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autoplan.errors import AutoplanError, UserInputError
from autoplan.formats import Precision
from autoplan.prune import check_nm
from autoplan.quant import QuantizedWeight, decode_e2m1, quantize_activation_codes

FP8 = torch.float8_e4m3fn
NVFP4_BLOCK = 16


# ---------------------------------------------------------------- device checks


def require_cuda(what: str, *tensors: torch.Tensor) -> None:
    """Raise a one-line error unless CUDA is present and every tensor lives on it."""
    if not torch.cuda.is_available():
        raise AutoplanError(f"{what} needs an NVIDIA GPU with CUDA; none found (torch.cuda.is_available() is False)")
    for t in tensors:
        if t.device.type != "cuda":
            raise UserInputError(f"{what}: tensors must be on a CUDA device, got one on {t.device}")


def nvfp4_unavailable_reason() -> str | None:
    """Why NVFP4 GEMMs cannot run here, or None when they can."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        return f"NVFP4 needs torch.float4_e2m1fn_x2, which torch {torch.__version__} lacks"
    if not torch.cuda.is_available():
        return "NVFP4 needs an NVIDIA GPU with CUDA; none found"
    major, minor = torch.cuda.get_device_capability()
    if major < 10:
        return f"NVFP4 GEMMs need a Blackwell GPU (SM100+); this one is SM{major}{minor}"
    return None


def _check_format(q: QuantizedWeight, precision: Precision, what: str) -> None:
    if q.precision is not precision or q.codes is None:
        raise UserInputError(f"{what} takes a {precision.value} QuantizedWeight from "
                             f"autoplan.quant.quantize_weight, got {q.precision.value}")


# ---------------------------------------------------------------- 2:4


def is_2_4_sparse(w: torch.Tensor) -> bool:
    """True when every group of 4 consecutive inputs holds at most 2 nonzeros."""
    return w.dim() == 2 and check_nm(w != 0, 2, 4)


def _check_2_4(w: torch.Tensor, what: str) -> None:
    if not is_2_4_sparse(w):
        raise UserInputError(f"{what}: the weight is not 2:4 sparse along its input dim; prune "
                             "it with autoplan.prune.compute_mask(w, Sparsity.parse('2:4')) first")


def to_semi_structured(w: torch.Tensor) -> torch.Tensor:
    """A 2:4-sparse bf16/fp16 weight [out, in] as a semi-structured tensor for `F.linear`."""
    require_cuda("to_semi_structured", w)
    if w.dtype not in (torch.bfloat16, torch.float16):
        raise UserInputError(f"to_semi_structured takes bf16/fp16 weights, got {w.dtype}; use compress_2_4_fp8 for fp8")
    _check_2_4(w, "to_semi_structured")
    from torch.sparse import to_sparse_semi_structured

    return to_sparse_semi_structured(w.contiguous())


# ---------------------------------------------------------------- FP8 W8A8


def fp8_inputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 inputs as autoplan.quant rounds them: (e4m3 codes [M, K], scale [M])."""
    codes, params, _ = quantize_activation_codes(x, Precision.FP8_E4M3)
    return codes.reshape(x.shape), params.scale.reshape(-1).float()


def _fp8_weight(q: QuantizedWeight, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    _check_format(q, Precision.FP8_E4M3, what)
    scale = q.scales["weight_scale"].float()
    if scale.numel() != q.codes.shape[0]:
        raise UserInputError(f"{what} needs per-channel scales (quantize_weight(..., "
                             "per_channel=True)), got one per tensor")
    return q.codes, scale.reshape(-1)


def _fp8_rowwise_mm(
    x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    # device-agnostic core: torch 2.13 also runs row-wise _scaled_mm on CPU, which tests use
    if w_fp8.dtype != FP8 or w_fp8.dim() != 2 or x.dim() != 2 or x.shape[1] != w_fp8.shape[1]:
        raise UserInputError(
            f"fp8_linear needs x [M, K] and an e4m3 weight [N, K]; got x {tuple(x.shape)}, "
            f"weight {tuple(w_fp8.shape)} {w_fp8.dtype}"
        )
    n, k = w_fp8.shape
    if k % 16 or n % 16:
        raise UserInputError(f"FP8 GEMMs need in and out divisible by 16, got weight {n}x{k}")
    if tuple(w_scale.shape) != (n,):
        raise UserInputError(f"w_scale must be per output channel, shape ({n},), got {tuple(w_scale.shape)}")
    xq, xs = fp8_inputs(x)
    return torch._scaled_mm(
        xq, w_fp8.t(),  # mat2 must be column-major: the [N, K] weight transposed is
        scale_a=xs[:, None].contiguous(), scale_b=w_scale.float()[None, :].contiguous(),
        out_dtype=out_dtype,
    )


def fp8_linear(
    x: torch.Tensor,
    w: QuantizedWeight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """W8A8 FP8 linear: per-token dynamic activation scales x per-channel weight scales.

    Args:
        x: [M, K] activations (bf16/fp16/fp32), quantized here per token.
        w: the fp8_e4m3 QuantizedWeight [N, K] (codes and per-channel scales).
        bias: optional [N], added in `out_dtype`.
        out_dtype: output dtype.
    """
    codes, scale = _fp8_weight(w, "fp8_linear")
    require_cuda("fp8_linear", x, codes)
    y = _fp8_rowwise_mm(x, codes, scale, out_dtype)
    return y if bias is None else y + bias.to(out_dtype)


@dataclass(frozen=True, eq=False)
class Fp8Sparse24Weight:
    """A 2:4-sparse e4m3 weight compressed for cuSPARSELt, with per-channel scales."""

    packed: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, int]


def compress_2_4_fp8(w: QuantizedWeight) -> Fp8Sparse24Weight:
    """Compress a 2:4-sparse fp8_e4m3 QuantizedWeight [out, in] for cuSPARSELt."""
    codes, scale = _fp8_weight(w, "compress_2_4_fp8")
    require_cuda("compress_2_4_fp8", codes)
    _check_2_4(codes.float(), "compress_2_4_fp8")
    n, k = codes.shape
    if n % 32 or k % 32:
        raise UserInputError(f"cuSPARSELt fp8 needs both weight sides divisible by 32, got {n}x{k}")
    return Fp8Sparse24Weight(torch._cslt_compress(codes), scale, (n, k))


def fp8_sparse_linear(
    x: torch.Tensor, w: Fp8Sparse24Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """2:4 sparse W8A8 FP8 linear through cuSPARSELt; output bf16 [M, N]."""
    require_cuda("fp8_sparse_linear", x, w.packed)
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise UserInputError(f"x must be [M, {w.shape[1]}], got {tuple(x.shape)}")
    m = x.shape[0]
    xq, xs = fp8_inputs(_pad_rows(x, 16))  # cuSPARSELt fp8 needs dense dims % 16
    y = torch._cslt_sparse_mm(
        w.packed, xq.t(), alpha=w.scale, out_dtype=torch.bfloat16, transpose_result=True
    )
    y = (y[:m].float() * xs[:m, None]).to(torch.bfloat16)
    return y if bias is None else y + bias.to(torch.bfloat16)


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = -x.shape[0] % multiple
    return x if pad == 0 else torch.cat([x, x.new_zeros(pad, x.shape[1])])


# ---------------------------------------------------------------- NVFP4


@dataclass(frozen=True, eq=False)
class Nvfp4Packed:
    """NVFP4 data of a 2-D tensor [R, C] as cuBLAS takes it: t = e2m1(codes) * scale / g.

    codes: uint8 [R, C/2], two E2M1 codes per byte, even column in the low nibble.
    block_scale: e4m3 [R, C/16]. global_scale: fp32 [1], autoplan's g = 448 * 6 / amax.
    """

    codes: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor


def _pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def _packed(codes: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor,
            what: str) -> Nvfp4Packed:
    rows, cols = codes.shape
    if cols % NVFP4_BLOCK:
        raise UserInputError(f"{what}: NVFP4 needs columns % 16 == 0, got {tuple(codes.shape)}")
    return Nvfp4Packed(_pack_fp4(codes), block_scale.reshape(rows, -1).contiguous(),
                       global_scale.float().reshape(1))


def pack_nvfp4(w: QuantizedWeight) -> Nvfp4Packed:
    """Pack an nvfp4 QuantizedWeight (unpacked E2M1 codes, E4M3 scales, global scale)."""
    _check_format(w, Precision.NVFP4, "pack_nvfp4")
    return _packed(w.codes, w.scales["weight_scale"], w.scales["global_scale"], "pack_nvfp4")


def nvfp4_inputs(x: torch.Tensor) -> Nvfp4Packed:
    """Activations [M, K] rounded to NVFP4 by autoplan.quant (global scale from their amax)."""
    codes, params, ctx = quantize_activation_codes(x, Precision.NVFP4)
    return _packed(codes, params.scale, ctx, "nvfp4_inputs")


def dequantize_nvfp4(p: Nvfp4Packed) -> torch.Tensor:
    """The float32 tensor an NVFP4 GEMM sees, (q * s) / g (for checks)."""
    rows = p.codes.shape[0]
    codes = torch.stack([p.codes & 0xF, p.codes >> 4], dim=2).reshape(rows, -1)
    vals = decode_e2m1(codes).reshape(rows, -1, NVFP4_BLOCK)
    return ((vals * p.block_scale.float()[..., None]).reshape(rows, -1)) / p.global_scale


def to_blocked_scales(scales: torch.Tensor) -> torch.Tensor:
    """Swizzle block scales [R, C/16] into cuBLAS's 128x4 tile layout, flattened.

    Rows pad to 128 and scale columns to 4; each 128x4 tile is stored as 32 rows of 16
    (row r of the tile at r % 32, group r // 32), tiles in row-major order.
    """
    rows, cols = scales.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    padded = scales.new_zeros(rb * 128, cb * 4)
    padded[:rows, :cols] = scales
    tiles = padded.reshape(rb, 128, cb, 4).permute(0, 2, 1, 3)  # [rb, cb, 128, 4]
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1).contiguous()


def nvfp4_linear(x: torch.Tensor, w: Nvfp4Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4 W4A4 linear (activations quantized here); SM100+ only; bf16 output [M, N]."""
    require_cuda("nvfp4_linear", x, w.codes)
    reason = nvfp4_unavailable_reason()
    if reason:
        raise AutoplanError(reason)
    xq = nvfp4_inputs(x)
    fp4 = torch.float4_e2m1fn_x2
    y = torch._scaled_mm(
        xq.codes.view(fp4), w.codes.view(fp4).t(),
        scale_a=to_blocked_scales(xq.block_scale), scale_b=to_blocked_scales(w.block_scale),
        out_dtype=torch.bfloat16,
    )
    y = (y.float() / (xq.global_scale * w.global_scale)).to(torch.bfloat16)
    return y if bias is None else y + bias.to(torch.bfloat16)


__all__ = [
    "Fp8Sparse24Weight",
    "Nvfp4Packed",
    "compress_2_4_fp8",
    "dequantize_nvfp4",
    "fp8_inputs",
    "fp8_linear",
    "fp8_sparse_linear",
    "is_2_4_sparse",
    "nvfp4_inputs",
    "nvfp4_linear",
    "nvfp4_unavailable_reason",
    "pack_nvfp4",
    "require_cuda",
    "to_blocked_scales",
    "to_semi_structured",
]
