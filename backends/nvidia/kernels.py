"""NVIDIA linear-layer kernels for the choices autoplan plans: 2:4, FP8 (W8A8), 2:4 FP8, NVFP4.

All run through PyTorch's own bindings (torch 2.13), nothing compiled here:

- 2:4 bf16/fp16: `torch.sparse.to_sparse_semi_structured` (cuSPARSELt, else CUTLASS); the
  result drops into `F.linear`.
- FP8 e4m3 W8A8: `torch._scaled_mm` with row-wise scales, i.e. a per-token activation scale
  [M, 1] times a per-output-channel weight scale [1, N], fp32 accumulation.
- 2:4 FP8: `torch._cslt_compress` + `torch._cslt_sparse_mm`. cuSPARSELt has no per-operand
  scales, so the per-channel weight scale goes in as its `alpha` vector and the per-token
  activation scale is applied to the output (torch's own fp8 2:4 path supports only
  per-tensor scales; this keeps the W8A8 recipe of `fp8_linear`).
- NVFP4 (E2M1 values, E4M3 scale per 16, fp32 global scale): `torch._scaled_mm` on
  `float4_e2m1fn_x2` with block scales in cuBLAS's swizzled layout; SM100+ only.

Math helpers (2:4 pruning, scale computation, FP4 packing, the scale swizzle) are plain torch
and run anywhere. Every kernel entry point raises a one-line AutoplanError without CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autoplan.errors import AutoplanError, UserInputError

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
# magnitudes of the eight non-negative E2M1 codes 0..7 (sign is bit 3)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


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


# ---------------------------------------------------------------- 2:4 helpers


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """Keep the 2 largest-magnitude weights of every 4 consecutive inputs (dim 1)."""
    if w.dim() != 2 or w.shape[1] % 4:
        raise UserInputError(f"2:4 pruning needs a 2-D weight with in % 4 == 0, got {tuple(w.shape)}")
    groups = w.reshape(w.shape[0], -1, 4)
    keep = groups.abs().float().topk(2, dim=2).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, keep, True)
    return (groups * mask).reshape(w.shape)


def is_2_4_sparse(w: torch.Tensor) -> bool:
    """True when every group of 4 consecutive inputs holds at most 2 nonzeros."""
    if w.dim() != 2 or w.shape[1] % 4:
        return False
    return bool((w.reshape(w.shape[0], -1, 4).ne(0).sum(dim=2) <= 2).all())


def _check_2_4(w: torch.Tensor, what: str) -> None:
    if not is_2_4_sparse(w):
        raise UserInputError(f"{what}: the weight is not 2:4 sparse along its input dim; prune it with prune_2_4 first")


def to_semi_structured(w: torch.Tensor) -> torch.Tensor:
    """A 2:4-sparse bf16/fp16 weight [out, in] as a semi-structured tensor for `F.linear`."""
    require_cuda("to_semi_structured", w)
    if w.dtype not in (torch.bfloat16, torch.float16):
        raise UserInputError(f"to_semi_structured takes bf16/fp16 weights, got {w.dtype}; use compress_2_4_fp8 for fp8")
    _check_2_4(w, "to_semi_structured")
    from torch.sparse import to_sparse_semi_structured

    return to_sparse_semi_structured(w.contiguous())


# ---------------------------------------------------------------- FP8 W8A8


def quantize_fp8_rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantization: (codes [R, C] fp8, scale [R] fp32), t ~= codes * scale."""
    if t.dim() != 2:
        raise UserInputError(f"row-wise quantization takes a 2-D tensor, got {tuple(t.shape)}")
    t32 = t.float()
    scale = t32.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX  # clamp: all-zero rows stay finite
    return (t32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


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
    xq, xs = quantize_fp8_rowwise(x)
    return torch._scaled_mm(
        xq, w_fp8.t(),  # mat2 must be column-major: the [N, K] weight transposed is
        scale_a=xs[:, None].contiguous(), scale_b=w_scale.float()[None, :].contiguous(),
        out_dtype=out_dtype,
    )


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale_rowwise: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """W8A8 FP8 linear: per-token dynamic activation scales x per-channel weight scales.

    Args:
        x: [M, K] activations (bf16/fp16/fp32), quantized here per token.
        w_fp8: [N, K] e4m3 weight codes (from `quantize_fp8_rowwise`).
        w_scale_rowwise: [N] fp32 weight scales.
        bias: optional [N], added in `out_dtype`.
        out_dtype: output dtype.
    """
    require_cuda("fp8_linear", x, w_fp8)
    y = _fp8_rowwise_mm(x, w_fp8, w_scale_rowwise, out_dtype)
    return y if bias is None else y + bias.to(out_dtype)


@dataclass(frozen=True, eq=False)
class Fp8Sparse24Weight:
    """A 2:4-sparse e4m3 weight compressed for cuSPARSELt, with per-channel scales."""

    packed: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, int]


def compress_2_4_fp8(w: torch.Tensor) -> Fp8Sparse24Weight:
    """Quantize a 2:4-sparse weight [out, in] per channel to e4m3 and compress it."""
    require_cuda("compress_2_4_fp8", w)
    _check_2_4(w, "compress_2_4_fp8")
    n, k = w.shape
    if n % 32 or k % 32:
        raise UserInputError(f"cuSPARSELt fp8 needs both weight sides divisible by 32, got {n}x{k}")
    codes, scale = quantize_fp8_rowwise(w)
    return Fp8Sparse24Weight(torch._cslt_compress(codes), scale, (n, k))


def fp8_sparse_linear(
    x: torch.Tensor, w: Fp8Sparse24Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """2:4 sparse W8A8 FP8 linear through cuSPARSELt; output bf16 [M, N]."""
    require_cuda("fp8_sparse_linear", x, w.packed)
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise UserInputError(f"x must be [M, {w.shape[1]}], got {tuple(x.shape)}")
    m = x.shape[0]
    xq, xs = quantize_fp8_rowwise(_pad_rows(x, 16))  # cuSPARSELt fp8 needs dense dims % 16
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
class Nvfp4Tensor:
    """NVFP4 data of a 2-D tensor [R, C]: t ~= e2m1(codes) * block_scale * global_scale.

    codes: uint8 [R, C/2], two E2M1 codes per byte, even column in the low nibble.
    block_scale: e4m3 [R, C/16]. global_scale: fp32 scalar tensor.
    """

    codes: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor


def _e2m1_encode(a: torch.Tensor) -> torch.Tensor:
    # round to nearest, ties to the even code (mantissa bit 0), as the hardware converts
    mag = a.abs()
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=a.device)
    ties_up = torch.tensor([False, True, False, True, False, True, False], device=a.device)
    code = (mag[..., None] > bounds).sum(-1) + ((mag[..., None] == bounds) & ties_up).sum(-1)
    return (code | ((a < 0).long() << 3)).to(torch.uint8)


def _e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    mag = torch.tensor(E2M1_VALUES, device=code.device)[(code & 7).long()]
    return torch.where((code & 8).bool(), -mag, mag)


def quantize_nvfp4(t: torch.Tensor) -> Nvfp4Tensor:
    """Quantize a 2-D tensor (columns divisible by 16) to NVFP4."""
    if t.dim() != 2 or t.shape[1] % NVFP4_BLOCK:
        raise UserInputError(f"NVFP4 needs a 2-D tensor with columns % 16 == 0, got {tuple(t.shape)}")
    rows, cols = t.shape
    blocks = t.float().reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    # the global scale maps the largest block scale onto e4m3's top value
    global_scale = (t.float().abs().amax().clamp(min=1e-12) / (FP8_MAX * E2M1_MAX)).reshape(())
    block_scale = (blocks.abs().amax(dim=2) / E2M1_MAX / global_scale).clamp(max=FP8_MAX).to(FP8)
    denom = (block_scale.float() * global_scale).clamp(min=1e-30)[..., None]
    codes = _e2m1_encode((blocks / denom).clamp(-E2M1_MAX, E2M1_MAX)).reshape(rows, cols)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return Nvfp4Tensor(packed.contiguous(), block_scale.contiguous(), global_scale)


def dequantize_nvfp4(q: Nvfp4Tensor) -> torch.Tensor:
    """The float32 tensor an NVFP4 GEMM sees."""
    rows = q.codes.shape[0]
    codes = torch.stack([q.codes & 0xF, q.codes >> 4], dim=2).reshape(rows, -1)
    vals = _e2m1_decode(codes).reshape(rows, -1, NVFP4_BLOCK)
    return (vals * q.block_scale.float()[..., None] * q.global_scale).reshape(rows, -1)


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


def nvfp4_linear(x: torch.Tensor, w: Nvfp4Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4 W4A4 linear (activations quantized here); SM100+ only; bf16 output [M, N]."""
    require_cuda("nvfp4_linear", x, w.codes)
    reason = nvfp4_unavailable_reason()
    if reason:
        raise AutoplanError(reason)
    xq = quantize_nvfp4(x)
    fp4 = torch.float4_e2m1fn_x2
    y = torch._scaled_mm(
        xq.codes.view(fp4), w.codes.view(fp4).t(),
        scale_a=to_blocked_scales(xq.block_scale), scale_b=to_blocked_scales(w.block_scale),
        out_dtype=torch.bfloat16,
    )
    y = (y.float() * (xq.global_scale * w.global_scale)).to(torch.bfloat16)
    return y if bias is None else y + bias.to(torch.bfloat16)


__all__ = [
    "Fp8Sparse24Weight",
    "Nvfp4Tensor",
    "compress_2_4_fp8",
    "dequantize_nvfp4",
    "fp8_linear",
    "fp8_sparse_linear",
    "is_2_4_sparse",
    "nvfp4_linear",
    "nvfp4_unavailable_reason",
    "prune_2_4",
    "quantize_fp8_rowwise",
    "quantize_nvfp4",
    "require_cuda",
    "to_blocked_scales",
    "to_semi_structured",
]
