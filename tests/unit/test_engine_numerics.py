"""Numerics pinned against the formulas the engines run (issue 13 item 4).

Each reference below is the engine's own formula, transcribed from its source (file and
version cited), not a call into autoplan. Where the library is importable the test also runs
the library itself, so a future release that changes its numerics shows up here.
"""

from __future__ import annotations

import pytest
import torch

from autoplan.formats import Choice
from autoplan.formats import Precision as P
from autoplan.formats.elements import decode_e8m0, encode_e8m0, mx_shared_exponent
from autoplan.formats.schemes import nvfp4_global_scale
from autoplan.quant import SimulatedLinear, quantize_activation_codes, quantize_weight
from autoplan.quant.weights import kernel_weight_dtype

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ---- MXFP4 block scales ----------------------------------------------------------------------
def _ct_mx_scale_codes(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 codes of compressed-tensors 0.20.1 ``generate_mx_scales`` (num_bits=4).

    compressed_tensors/quantization/utils/mxfp_utils.py: ``round_to_power_2`` adds
    ``1 << (mantissa - 1 - 1)`` to the float's bits and masks off the mantissa, then
    ``127 + floor(log2(.)) - 2``; vLLM tests/quantization/reference_mxfp4.py
    (``qdq_mxfp4_torch``, "even") does the same on bf16/fp16 and clamps to [0, 254].
    """
    if amax.dtype == torch.bfloat16:
        bits, mant, exp, itype = amax.view(torch.uint16).to(torch.int32), 7, 8, torch.uint16
    else:
        bits, mant, exp, itype = amax.view(torch.int32), 23, 8, torch.int32
    add = 1 << (mant - 1 - 1)
    mask = ((1 << (exp + 1)) - 1) << mant
    masked = torch.bitwise_and(bits + add, mask)
    pow2 = (masked.to(itype).view(amax.dtype) if itype is torch.uint16
            else masked.view(torch.float32))
    code = 127 + torch.floor(torch.log2(pow2.float())) - 2
    return code.clamp(0, 254).to(torch.uint8)


def _all_finite_positive_bf16() -> torch.Tensor:
    # every positive bf16 below the top binade's last values, whose "round up" overflows to
    # inf in the reference (an amax of 3.3e38 is not a block any model has)
    return torch.arange(0, 0x7F60, dtype=torch.int32).to(torch.uint16).view(torch.bfloat16)


def test_mxfp4_scales_match_compressed_tensors_on_every_bf16_amax():
    amax = _all_finite_positive_bf16()
    ours = encode_e8m0(mx_shared_exponent(amax.float(), rounding="even"))
    assert torch.equal(ours, _ct_mx_scale_codes(amax))
    floor = encode_e8m0(mx_shared_exponent(amax.float()))
    normal = amax.float() >= 2.0**-120
    share = float((floor != ours)[normal].float().mean())
    assert 0.2 < share < 0.3  # 32 of the 128 mantissas of every binade round up


def test_mxfp4_scales_match_compressed_tensors_on_fp32_amax():
    gen = torch.Generator().manual_seed(0)
    mags = torch.exp2(torch.empty(200_000).uniform_(-40, 40, generator=gen))
    edges = torch.tensor([1.75, 1.75 - 2**-22, 1.75 + 2**-22, 7.0, 6.999999, 2.0**-126,
                          3.5 * 2.0**-60, 0.0])
    amax = torch.cat([mags, edges])
    ours = encode_e8m0(mx_shared_exponent(amax, rounding="even"))
    assert torch.equal(ours, _ct_mx_scale_codes(amax))
    try:
        from compressed_tensors.quantization.utils.mxfp_utils import generate_mx_scales
    except ImportError:
        return
    lib = generate_mx_scales(amax, num_bits=4).clamp(0, 254).to(torch.uint8)
    assert torch.equal(ours, lib)


def _e2m1_rne(v: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value, ties to the even code, saturating at 6 (vLLM's
    fp16_to_fp4_simulate: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4)."""
    mag = v.abs().clamp(max=6.0)
    dist = (mag.unsqueeze(-1) - E2M1_GRID).abs()
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    idx = torch.arange(8).expand_as(dist)
    # of the nearest codes take the even one (code index parity = mantissa bit)
    even = torch.where(ties & (idx % 2 == 0), idx, 99).min(dim=-1).values
    any_ = torch.where(ties, idx, 99).min(dim=-1).values
    pick = torch.where(even < 99, even, any_)
    return torch.copysign(E2M1_GRID[pick], v)


def test_mxfp4_weights_match_vllm_reference_qdq_on_bf16():
    """vLLM reference_mxfp4.qdq_mxfp4_torch: scale from the "even" exponent, x / scale in
    bf16 (exact: a power of two), RNE to E2M1, times the scale."""
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(64, 256, generator=gen) * torch.exp2(torch.randint(-8, 4, (64, 1),
                                                                         generator=gen))
         ).to(torch.bfloat16)
    blocks = w.reshape(64, -1, 32)
    codes = _ct_mx_scale_codes(blocks.abs().amax(-1))
    scale = torch.exp2(codes.float() - 127).to(torch.bfloat16).unsqueeze(-1)
    ref = (_e2m1_rne((blocks / scale).float()) * scale.float()).reshape(64, 256)
    q = quantize_weight(w, P.MXFP4)
    assert torch.equal(q.scales["weight_scale"], codes)
    assert torch.equal(q.dequant, ref)
    assert torch.equal(decode_e8m0(codes), scale.squeeze(-1).float())


# ---- INT8 per-token activations --------------------------------------------------------------
def _vllm_dynamic_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM csrc/quantization/compressed_tensors/int8_quant_kernels.cu
    (dynamic_scaled_int8_quant_kernel, v0.11): per token ``scale = absmax / 127.0f``,
    ``float_to_int8_rn(x * (127.0f / absmax))`` = cvt.rni.sat.s8.f32 (half to even,
    saturating, NaN -> 0)."""
    xf = x.float()
    absmax = xf.abs().amax(-1, keepdim=True)
    q = torch.round(xf * (127.0 / absmax)).nan_to_num(0.0).clamp(-128, 127)
    return q.to(torch.int8), absmax / 127.0


def _rows_with_ties(n_rows: int = 4096, k: int = 512) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n_rows, k, generator=gen).to(torch.bfloat16)
    return torch.cat([x, torch.zeros(1, k, dtype=torch.bfloat16)])  # an all-zero token


def test_int8_per_token_activations_match_vllm_kernel():
    x = _rows_with_ties()
    codes, params, _ = quantize_activation_codes(x, P.INT8)
    ref_codes, ref_scale = _vllm_dynamic_int8(x)
    assert torch.equal(codes, ref_codes)
    assert torch.equal(params.scale, ref_scale)
    assert codes[-1].eq(0).all() and params.scale[-1].item() == 0.0
    # the sample is discriminating: the old x / (amax / 127) flips some codes
    xf = x.float()
    old = torch.round(xf / (xf.abs().amax(-1, keepdim=True) / 127.0)).nan_to_num(0.0)
    assert int((old.to(torch.int8) != ref_codes).sum()) > 0


def test_static_int8_activation_scale_is_vllms_divide_kernel():
    """static_scaled_int8_quant_kernel: ``float_to_int8_rn(x / scale)``."""
    x = _rows_with_ties(64, 128).float()
    s = torch.tensor(0.0173)
    codes, _, _ = quantize_activation_codes(x, P.INT8, static_scale=s)
    assert torch.equal(codes, torch.round(x / s).clamp(-128, 127).to(torch.int8))


# ---- bf16 models: the kernel's arithmetic ------------------------------------------------------
@pytest.mark.parametrize("precision", [P.FP8_E4M3, P.INT8, P.NVFP4, P.MXFP4, P.INT4A8_G32,
                                       P.Q4_0])
def test_scaled_kernels_keep_the_bf16_models_weight_in_fp32(precision):
    """cutlass_scaled_mm / torch._scaled_mm (FP8, INT8), the FP4 GEMMs and the block-int8
    CPU kernels multiply codes and apply the scales in fp32: the simulated weight is
    ``code * scale`` in fp32, never rounded to the model's bf16."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(32, 128, generator=gen) * 0.02).to(torch.bfloat16)
    q = quantize_weight(w, precision)
    assert kernel_weight_dtype(precision, torch.bfloat16) is torch.float32
    assert q.dequant.dtype == torch.float32
    if precision in (P.FP8_E4M3, P.INT8):
        ref = q.codes.float() * q.scales["weight_scale"].float()
        assert torch.equal(q.dequant, ref)
        assert not torch.equal(q.dequant, ref.to(torch.bfloat16).float())  # bf16 would differ
    sim = SimulatedLinear(q, torch.ones_like(w, dtype=torch.bool), None,
                          Choice.parse(precision.value))
    assert torch.equal(sim.weight, q.dequant)


@pytest.mark.parametrize("precision", [P.INT4_G128, P.UINT4_G32, P.INT8_WO])
def test_weight_only_kernels_dequantize_into_the_model_dtype(precision):
    """Marlin / Machete (W4A16, W8A16) dequantize into the activation dtype (bf16) and run a
    bf16 GEMM: the simulated weight is rounded to bf16."""
    w = (torch.randn(16, 128, generator=torch.Generator().manual_seed(4)) * 0.02
         ).to(torch.bfloat16)
    q = quantize_weight(w, precision)
    assert q.dequant.dtype == torch.bfloat16


# ---- NVFP4 global scale and scale floors -------------------------------------------------------
def _ct_generate_gparam(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors 0.20.1 quantization/utils/helpers.py ``generate_gparam``: clamp
    amax to fp32 tiny, ``448 * 6 / amax``, NaN/inf -> 1.0."""
    a = torch.clamp(amax.float(), min=torch.finfo(torch.float32).tiny)
    return torch.nan_to_num(448.0 * 6.0 / a, nan=1.0, posinf=1.0, neginf=1.0).reshape(1)


@pytest.mark.parametrize("amax", [0.0, 1e-40, 1e-37, 7.8e-36, 7.9e-36, 8e-36, 3e-3, 1.0, 6e4,
                                  float("nan")])
def test_nvfp4_global_scale_matches_compressed_tensors(amax):
    a = torch.tensor(amax)
    assert torch.equal(nvfp4_global_scale(a), _ct_generate_gparam(a))
    try:
        from compressed_tensors.quantization.utils import generate_gparam
    except ImportError:
        return
    assert torch.equal(nvfp4_global_scale(a), generate_gparam(a.reshape(1), a.reshape(1)))


def test_nvfp4_tiny_tensor_dequantizes_without_nan():
    w = torch.zeros(4, 32)
    w[0, :3] = torch.tensor([1e-37, -2e-37, 5e-38])
    q = quantize_weight(w, P.NVFP4)
    assert q.scales["global_scale"].item() == 1.0
    assert torch.isfinite(q.dequant).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_integer_scales_are_floored_only_at_zero(dtype):
    """compressed-tensors 0.20.1 calculate_qparams step 5: a scale that is exactly 0 becomes
    the scale dtype's eps; any other scale is kept (the old clamp at fp32 eps coarsened tiny
    groups)."""
    w = torch.zeros(3, 64)
    w[0] = torch.linspace(-3e-9, 3e-9, 64)  # amax / 7.5 = 4e-10, far below fp32 eps
    w[1] = torch.linspace(-0.5, 0.5, 64)
    q = quantize_weight(w.to(dtype), P.INT4_G32)
    s = q.scales["weight_scale"]
    expect = (w.to(dtype).float().reshape(3, 2, 32).abs().amax(-1) / 7.5).to(dtype)
    expect[2] = torch.finfo(dtype).eps
    assert torch.equal(s, expect)
    err = (q.dequant.float() - w.to(dtype).float())[0].abs().max()
    assert err <= 0.51 * s[0].float().max()  # the tiny group keeps its 4 bits
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.utils import calculate_qparams

    args = ct.QuantizationArgs(num_bits=4, type="int", strategy="group", symmetric=True,
                               group_size=32)
    groups = w.to(dtype).reshape(3, 2, 32)
    lib, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    assert torch.equal(s, lib)
