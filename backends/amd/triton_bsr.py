"""Block-sparse (BSR) linear layers in Triton: the vendor-neutral kernel behind `blockB@P`.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from autoplan.errors import AutoplanError, UserInputError
from autoplan.formats import Precision
from autoplan.quant import QuantizedWeight, quantize_activation_codes

try:  # optional dependency; only bsr_linear needs it
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - a missing or broken triton only disables the kernel
    triton = None
    tl = None

BLOCK_SIZES = (16, 32, 64)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def to_e4m3fnuz(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact e4m3fn -> e4m3fnuz: same bits at half the value, so the scale doubles."""
    bits = codes.view(torch.int8)
    bits = torch.where(bits == -128, torch.zeros_like(bits), bits)  # fn's -0 is fnuz's NaN
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0


def quantize_inputs(x: torch.Tensor, precision: Precision, *, fnuz: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token W8A8 inputs of a ``precision`` layer as autoplan.quant rounds them: (codes
    [M, K] in the format's code dtype, e4m3fnuz when ``fnuz``; scale [M])."""
    if precision not in (Precision.INT8, Precision.FP8_E4M3):
        raise UserInputError(f"BSR quantizes int8 or fp8_e4m3 inputs, not {precision.value}")
    codes, params, _ = quantize_activation_codes(x, precision)
    scale = params.scale.reshape(-1).float()
    if fnuz:
        return to_e4m3fnuz(codes, scale)
    return codes, scale


def block_mask_of(w: torch.Tensor, block: int) -> torch.Tensor:
    """Bool [out/B, in/B]: True where the B x B tile of `w` holds any nonzero."""
    _check_shape(w, block)
    rows, cols = w.shape
    tiles = w.reshape(rows // block, block, cols // block, block)
    return tiles.ne(0).any(dim=3).any(dim=1)


@dataclass(frozen=True, eq=False)
class BsrWeight:
    """A linear weight W[out, in] in BSR form (the layout: docs/modules.md)."""

    values: torch.Tensor
    col_indices: torch.Tensor
    row_ptr: torch.Tensor
    shape: tuple[int, int]
    block: int
    scale: torch.Tensor | None = None
    precision: Precision | None = None  # the format of quantized values (None: float values)

    @classmethod
    def from_dense(
        cls,
        w: torch.Tensor,
        block: int,
        *,
        block_mask: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> BsrWeight:
        """Build from a float weight (values kept as they are, in `dtype` if given).

        Args:
            w: 2-D weight [out, in]; both sides divisible by `block`.
            block: tile size (16, 32 or 64).
            block_mask: bool [out/B, in/B] of tiles to keep; default keeps every tile with a
                nonzero (the zero pattern of `w`). Tiles outside the mask are dropped.
            dtype: None keeps w's dtype, else float32/bfloat16/float16. Quantized values
                come from autoplan.quant: use `from_quantized`.
        """
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise UserInputError(
                f"unsupported BSR value dtype {dtype}: use float32, bfloat16 or float16, or "
                "BsrWeight.from_quantized for int8/fp8 weights made by autoplan.quant"
            )
        return cls._build(w if dtype is None else w.to(dtype), block, block_mask, None)

    @classmethod
    def from_quantized(
        cls,
        q: QuantizedWeight,
        block: int,
        *,
        block_mask: torch.Tensor | None = None,
        fnuz: bool = False,
    ) -> BsrWeight:
        """Pack an int8 or fp8_e4m3 QuantizedWeight (per-channel scales) of a block-pruned
        weight; `fnuz` converts fp8 to MI300's e4m3fnuz (exactly, see the module doc)."""
        if q.precision not in (Precision.INT8, Precision.FP8_E4M3) or q.codes is None:
            raise UserInputError(f"BSR packs int8 or fp8_e4m3 QuantizedWeights, got "
                                 f"{q.precision.value}")
        scale = q.scales["weight_scale"].float().reshape(-1)
        if scale.numel() != q.codes.shape[0]:
            raise UserInputError("BSR needs per-channel weight scales (quantize_weight(..., "
                                 "per_channel=True))")
        codes = q.codes
        if fnuz:
            if q.precision is not Precision.FP8_E4M3:
                raise UserInputError("fnuz applies to fp8_e4m3 weights only")
            codes, scale = to_e4m3fnuz(codes, scale)
        return cls._build(codes, block, block_mask, scale, q.precision)

    @classmethod
    def _build(cls, values: torch.Tensor, block: int, block_mask: torch.Tensor | None,
               scale: torch.Tensor | None, precision: Precision | None = None) -> BsrWeight:
        mask = block_mask_of(values.float(), block) if block_mask is None else block_mask
        rows, cols = values.shape
        grid = (rows // block, cols // block)
        if mask.dtype != torch.bool or tuple(mask.shape) != grid:
            raise UserInputError(
                f"block_mask must be a bool tensor of shape {grid} for weight "
                f"{tuple(values.shape)} and block {block}, got {mask.dtype} {tuple(mask.shape)}"
            )
        mask = mask.to(values.device)
        tiles = values.reshape(grid[0], block, grid[1], block).permute(0, 2, 1, 3)
        counts = mask.sum(dim=1)
        row_ptr = torch.zeros(grid[0] + 1, dtype=torch.int32, device=values.device)
        row_ptr[1:] = counts.cumsum(0)
        return cls(
            values=tiles[mask].contiguous(),  # row-major over (r, c): BSR order
            col_indices=mask.nonzero()[:, 1].to(torch.int32).contiguous(),
            row_ptr=row_ptr,
            shape=(rows, cols),
            block=block,
            scale=scale,
            precision=precision,
        )

    @property
    def nnz_blocks(self) -> int:
        return int(self.values.shape[0])

    @property
    def density(self) -> float:
        """Fraction of tiles kept."""
        rows, cols = self.shape
        return self.nnz_blocks * self.block * self.block / (rows * cols)

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads for the weight: values, indices and scales."""
        parts = [self.values, self.col_indices, self.row_ptr]
        parts += [self.scale] if self.scale is not None else []
        return sum(p.numel() * p.element_size() for p in parts)

    def block_mask(self) -> torch.Tensor:
        """Bool [out/B, in/B] of stored tiles."""
        rows, cols = self.shape
        counts = (self.row_ptr[1:] - self.row_ptr[:-1]).long()
        row_of = torch.repeat_interleave(torch.arange(rows // self.block, device=counts.device), counts)
        mask = torch.zeros(rows // self.block, cols // self.block, dtype=torch.bool, device=counts.device)
        mask[row_of, self.col_indices.long()] = True
        return mask

    def to_dense(self, dequantize: bool = True) -> torch.Tensor:
        """Dense W[out, in]; quantized values come back as float32 W unless dequantize=False."""
        rows, cols = self.shape
        b = self.block
        tiles = torch.zeros(rows // b, cols // b, b, b, dtype=torch.float32, device=self.values.device)
        tiles[self.block_mask()] = self.values.float()
        dense = tiles.permute(0, 2, 1, 3).reshape(rows, cols)
        if self.scale is None:
            return dense.to(self.values.dtype)
        if not dequantize:
            return dense.to(self.values.dtype)
        return dense * self.scale[:, None]

    def quantize_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x rounded per token as this weight's format rounds its inputs, in the values'
        code dtype (e4m3fnuz values take e4m3fnuz inputs)."""
        if self.precision is None:
            raise UserInputError("float BSR values take float inputs; only int8/fp8 weights "
                                 "quantize them")
        return quantize_inputs(x, self.precision,
                               fnuz=self.values.dtype == torch.float8_e4m3fnuz)

    def to(self, device: torch.device | str) -> BsrWeight:
        """A copy on another device."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return BsrWeight(
            move(self.values), move(self.col_indices), move(self.row_ptr),
            self.shape, self.block, move(self.scale), self.precision,
        )


def bsr_linear_reference(
    x: torch.Tensor, w: BsrWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Dense torch computation of exactly the math `bsr_linear` performs (for checks)."""
    _check_inputs(x, w, bias)
    codes = w.to_dense(dequantize=False)
    if w.scale is None:
        acc = x.float() @ codes.float().T
    else:
        xq, xs = w.quantize_inputs(x)
        # float64 sums int8 products exactly, like the kernel's int32 accumulator
        acc_dtype = torch.float64 if w.values.dtype == torch.int8 else torch.float32
        acc = (xq.to(acc_dtype) @ codes.to(acc_dtype).T).float()
        acc = acc * xs[:, None] * w.scale[None, :]
    if bias is not None:
        acc = acc + bias.float()[None, :]
    return acc.to(x.dtype)


def bsr_linear(x: torch.Tensor, w: BsrWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) with the Triton block-sparse kernel.

    Args:
        x: activations [M, in]; float32/bf16/fp16 (same dtype as the values for float
            weights, any float dtype for fp8/int8 weights).
        w: the BSR weight, on x's device.
        bias: optional [out].

    Returns:
        [M, out] in x's dtype.
    """
    _check_inputs(x, w, bias)
    if triton is None:
        raise AutoplanError("bsr_linear needs triton: pip install 'autoplan[triton]'")
    m, _ = x.shape
    n = w.shape[0]
    vdtype = w.values.dtype
    quantized = w.scale is not None
    if quantized:
        xq, xs = w.quantize_inputs(x)
    else:
        if x.dtype != vdtype:
            raise UserInputError(f"x is {x.dtype} but the BSR values are {vdtype}: cast one of them")
        xq, xs = x.contiguous(), None
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    interpreted = x.device.type == "cpu"
    block_m = _block_m(m, interpreted)
    grid = (triton.cdiv(m, block_m), n // w.block)
    dummy = y  # never read: the matching HAS_* flag is off
    _kernel(interpreted)[grid](
        xq, w.values, w.col_indices, w.row_ptr,
        xs if xs is not None else dummy,
        w.scale if quantized else dummy,
        bias if bias is not None else dummy,
        y, m, xq.stride(0), y.stride(0),
        BLOCK=w.block, BLOCK_M=block_m,
        HAS_SCALES=quantized, HAS_BIAS=bias is not None,
        INT_DOT=vdtype == torch.int8,
        # the interpreter multiplies 16-bit floats wrongly (numpy has no bf16): upcast there;
        # fp32 products of 16-bit inputs are exact, so the math is unchanged
        UPCAST=interpreted and vdtype in (torch.bfloat16, torch.float16),
        IEEE=vdtype == torch.float32,
        num_warps=8 if block_m * w.block >= 8192 else 4,
    )
    return y


def _bsr_linear_kernel(
    x_ptr, vals_ptr, col_ptr, rowptr_ptr, xscale_ptr, wscale_ptr, bias_ptr, y_ptr,
    M, stride_xm, stride_ym,
    BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    INT_DOT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_r = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_b = tl.arange(0, BLOCK)
    m_mask = offs_m < M
    rows = tl.minimum(offs_m, M - 1)
    start = tl.load(rowptr_ptr + pid_r)
    end = tl.load(rowptr_ptr + pid_r + 1)
    if INT_DOT:
        acc = tl.full((BLOCK_M, BLOCK), 0, dtype=tl.int32)
    else:
        acc = tl.full((BLOCK_M, BLOCK), 0, dtype=tl.float32)
    for j in range(start, end):
        col = tl.load(col_ptr + j)
        # rows past M re-read row M-1 (never stored): no masked `other`, which fp8 can't take
        x = tl.load(x_ptr + rows[:, None] * stride_xm + (col * BLOCK + offs_b)[None, :])
        # the tile is stored [out, in]; read it as [in, out] so that acc += x @ tile^T
        w = tl.load(vals_ptr + j * BLOCK * BLOCK + offs_b[None, :] * BLOCK + offs_b[:, None])
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if INT_DOT:
            acc += tl.dot(x, w, out_dtype=tl.int32)
        elif IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    out = acc.to(tl.float32)
    offs_n = pid_r * BLOCK + offs_b
    if HAS_SCALES:
        out = out * tl.load(xscale_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
        out = out * tl.load(wscale_ptr + offs_n)[None, :]
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=m_mask[:, None])


@functools.cache
def _kernel(interpreted: bool):
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_bsr_linear_kernel)
    return triton.jit(_bsr_linear_kernel)


def _block_m(m: int, interpreted: bool) -> int:
    # tl.dot needs >= 16 rows; larger tiles reuse each weight tile across more tokens on GPU
    cap = 64 if interpreted else 128
    return min(cap, max(16, triton.next_power_of_2(m)))


def _check_shape(w: torch.Tensor, block: int) -> None:
    if block not in BLOCK_SIZES:
        raise UserInputError(f"block size must be one of {BLOCK_SIZES}, got {block}")
    if w.dim() != 2 or w.shape[0] % block or w.shape[1] % block:
        raise UserInputError(
            f"a BSR weight must be 2-D with both sides divisible by {block}, got {tuple(w.shape)}"
        )


def _check_inputs(x: torch.Tensor, w: BsrWeight, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise UserInputError(f"x must be [M, {w.shape[1]}] for weight {w.shape}, got {tuple(x.shape)}")
    if x.device != w.values.device:
        raise UserInputError(f"x is on {x.device} but the weight is on {w.values.device}: move one")
    if not x.dtype.is_floating_point or x.dtype in FP8_DTYPES:
        raise UserInputError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise UserInputError(f"bias must be [{w.shape[0]}], got {tuple(bias.shape)}")


__all__ = [
    "BLOCK_SIZES",
    "BsrWeight",
    "block_mask_of",
    "bsr_linear",
    "bsr_linear_reference",
    "quantize_inputs",
    "to_e4m3fnuz",
]
