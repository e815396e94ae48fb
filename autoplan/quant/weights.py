"""quantize_weight: the one entry point that turns a weight matrix into a simulated format."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from autoplan.errors import UserInputError
from autoplan.formats import Precision, format_spec
from autoplan.formats.schemes import Scheme, quantize_rows
from autoplan.quant.gptq import gptq_quantize
from autoplan.quant.methods import QuantMethod


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight as the serving kernel would see it.

    Attributes:
        dequant: the simulated weight as the kernel multiplies it, same shape as the input
            weight; its dtype is ``kernel_weight_dtype(precision, w.dtype)``: float32 where
            the kernel applies scales in its fp32 epilogue, else the model's dtype.
        scales: named scale tensors in their storage dtypes, named as compressed-tensors
            checkpoints name them: ``weight_scale`` ([out, 1] per channel, [1] per tensor,
            [out, n_groups] for grouped formats: bf16/fp16/fp32 for INT, float8_e4m3fn for
            NVFP4, uint8 E8M0 codes for MXFP4), ``weight_zero_point`` (asymmetric UINT4:
            uint8 [out, n_groups] in 0..15) and ``global_scale`` (NVFP4, FP32 [1]).
            Empty for fp32/bf16/fp16.
        codes: the stored values: int8 for INT8/INT4 (INT4 in [-8, 7], unpacked), uint8
            0..15 for UINT4 (dequant = (code - zero point) * scale), float8 for FP8, uint8
            4-bit E2M1 codes for NVFP4/MXFP4 (sign in bit 3), None for 16/32-bit floats.
        precision: the format.
    """

    dequant: Tensor
    scales: dict[str, Tensor] = field(default_factory=dict)
    codes: Tensor | None = None
    precision: Precision = Precision.FP32


def kernel_weight_dtype(precision: Precision, dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the serving kernel holds a dequantized ``precision`` weight.

    Weight-only formats (W4A16/W8A16: vLLM's Marlin and Machete, MatMulNBits level 0)
    dequantize ``(code - zero) * scale`` into the activation dtype, i.e. the model's 16-bit
    dtype, before a 16-bit GEMM: rounding the simulated weight to ``dtype`` is their
    arithmetic. Every other quantized format multiplies the codes themselves (FP8/INT8
    W8A8 ``cutlass_scaled_mm`` / ``torch._scaled_mm``, the NVFP4/MXFP4 FP4 GEMMs, MatMulNBits
    level 4, llama.cpp's integer dots) and applies the scales in fp32 (the block scales
    inside the fp32 accumulation, per-channel and global scales in the fp32 epilogue), so
    the simulated weight ``code * scale`` stays fp32: rounding it to bf16 would change
    78-93 % of bf16 weights by ~1.6e-3 rms (issue 13). Unquantized 16-bit formats hold
    their values exactly in fp32 too.
    """
    return dtype if format_spec(precision).info.weight_only else torch.float32


def weight_scheme(precision: Precision, dtype: torch.dtype, *, per_channel: bool = True) -> Scheme:
    """The scheme that stores weights of ``dtype`` in ``precision`` (its FormatSpec's)."""
    return format_spec(precision).weight_scheme(dtype, per_channel=per_channel)


def quantize_weight(
    w: Tensor,
    precision: Precision,
    *,
    method: QuantMethod | str = QuantMethod.RTN,
    hessian: Tensor | None = None,
    per_channel: bool = True,
    mask: Tensor | None = None,
    blocksize: int = 128,
    damp: float = 0.01,
    with_codes: bool = True,
) -> QuantizedWeight:
    """Quantize a linear weight ``w`` [out, in] to ``precision``, bit-exactly.

    Scales are computed from the weight after ``mask`` is applied (a pruned weight gets
    scales recalibrated on what is kept) and masked positions are exactly zero afterwards.

    Args:
        w: the weight, any float dtype; groups run along the input dim (dim 1).
        precision: target format. Weight-only and W8A8 variants quantize weights the same.
        method: "rtn" (round to nearest) or "gptq" (needs ``hessian``).
        hessian: [in, in] Hessian ``2 X^T X / n`` of the layer inputs, for GPTQ.
        per_channel: one scale per output channel (default) or one per tensor; only FP8
            and INT8 have a per-tensor variant, grouped formats ignore it.
        mask: optional keep-mask (True = kept) of ``w``'s shape.
        blocksize: GPTQ lazy-batch width.
        damp: GPTQ dampening, as a fraction of the mean Hessian diagonal.
        with_codes: False skips storing the codes (``codes`` is None): what the sensitivity
            profile asks for, which only multiplies the dequantized weight; ``dequant`` and
            ``scales`` are the same bits either way.

    Returns:
        The QuantizedWeight.

    Raises:
        UserInputError: unknown method, wrong shapes, or GPTQ without a Hessian.
    """
    method = QuantMethod.parse(method)
    if w.ndim != 2:
        raise UserInputError(
            f"quantize_weight needs a 2-D [out, in] weight, got shape {tuple(w.shape)}"
        )
    if mask is not None and mask.shape != w.shape:
        raise UserInputError(
            f"mask shape {tuple(mask.shape)} does not match weight {tuple(w.shape)}"
        )
    scheme = weight_scheme(precision, w.dtype, per_channel=per_channel)
    if method is QuantMethod.GPTQ:
        if hessian is None:
            raise UserInputError("method='gptq' needs the layer Hessian: pass hessian=2*X.T@X/n")
        deq, codes, params, ctx = gptq_quantize(
            w, hessian, scheme, mask=mask, blocksize=blocksize, damp=damp
        )
    else:
        wf = w.detach().float()
        if mask is not None:
            wf = wf * mask
        ctx = scheme.prepare(wf)
        deq, codes, params = quantize_rows(wf, scheme, ctx)
    if mask is not None:  # the -0.0 of a masked negative weight becomes a clean +0 code
        # in place: deq and codes are this function's own results (never an alias of w,
        # since a mask makes wf a product), and masked_fill_ is about 2x torch.where here
        dropped = ~mask.to(torch.bool)
        deq = deq.masked_fill_(dropped, 0.0)
        if with_codes:
            codes = codes.masked_fill_(dropped, 0.0)
    return QuantizedWeight(
        dequant=deq.to(kernel_weight_dtype(precision, w.dtype)),
        scales=scheme.scale_dict(params, ctx),
        codes=scheme.store_codes(codes) if with_codes else None,
        precision=precision,
    )


__all__ = ["QuantizedWeight", "kernel_weight_dtype", "quantize_weight", "weight_scheme"]
