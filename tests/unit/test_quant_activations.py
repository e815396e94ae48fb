"""Activation fake-quantization per precision, against explicit reference formulas."""

from __future__ import annotations

import pytest
import torch

from autoplan.formats import Precision
from autoplan.quant import (
    cast_e2m1,
    cast_fp8_e4m3,
    cast_fp8_e5m2,
    quantize_activation,
    quantize_weight,
    round_to_bf16,
)

P = Precision


def _x(shape=(2, 3, 64), seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("precision", [P.FP32, P.INT8_WO, P.INT4_G32, P.INT4_G64, P.INT4_G128])
def test_weight_only_and_fp32_leave_activations_alone(precision):
    x = _x()
    assert torch.equal(quantize_activation(x, precision), x)


def test_bf16_and_fp16_round():
    x = _x()
    assert torch.equal(quantize_activation(x, P.BF16), round_to_bf16(x))
    assert quantize_activation(x, P.FP16).dtype == torch.float32


@pytest.mark.parametrize(
    ("precision", "cast", "fmax"),
    [(P.FP8_E4M3, cast_fp8_e4m3, 448.0), (P.FP8_E5M2, cast_fp8_e5m2, 57344.0)],
)
def test_fp8_dynamic_per_token(precision, cast, fmax):
    x = _x()
    s = x.abs().amax(-1, keepdim=True) / fmax
    assert torch.equal(quantize_activation(x, precision), cast(x / s) * s)


def test_fp8_static_scale_saturates():
    x = torch.tensor([[1.0, -1000.0, 0.01]])
    got = quantize_activation(x, P.FP8_E4M3, static_scale=torch.tensor(1.0))
    assert got.tolist() == [[1.0, -448.0, cast_fp8_e4m3(torch.tensor(0.01)).item()]]


def test_int8_dynamic_per_token_and_static():
    x = _x()
    s = x.abs().amax(-1, keepdim=True) / 127
    assert torch.equal(quantize_activation(x, P.INT8), torch.round(x / s).clamp(-128, 127) * s)
    static = quantize_activation(
        torch.tensor([[0.5, 1.5, 300.0, -300.0]]), P.INT8, static_scale=torch.tensor([1.0])
    )
    assert static.tolist() == [[0.0, 2.0, 127.0, -128.0]]


def test_zero_token_stays_zero():
    x = torch.zeros(3, 32)
    for p in (P.FP8_E4M3, P.INT8, P.NVFP4, P.MXFP4):
        y = quantize_activation(x, p)
        assert y.eq(0).all() and not y.isnan().any(), p


def test_nvfp4_activation_blocks_of_16_with_global_scale():
    x = _x((4, 32))
    g = 448 * 6 / x.abs().amax()
    s = ((x.reshape(4, 2, 16).abs().amax(-1, keepdim=True) / 6) * g).to(torch.float8_e4m3fn).float()
    ref = (cast_e2m1(x.reshape(4, 2, 16) / (s / g)) * s / g).reshape(4, 32)
    assert torch.equal(quantize_activation(x, P.NVFP4), ref)
    g_static = torch.tensor(100.0)
    s2 = ((x.reshape(4, 2, 16).abs().amax(-1, keepdim=True) / 6) * g_static).clamp(max=448)
    s2 = s2.to(torch.float8_e4m3fn).float()
    ref2 = (cast_e2m1(x.reshape(4, 2, 16) / (s2 / g_static)) * s2 / g_static).reshape(4, 32)
    assert torch.equal(quantize_activation(x, P.NVFP4, static_scale=g_static), ref2)


def test_mxfp4_activation_matches_weight_math_and_keeps_shape():
    x = _x((2, 5, 64))
    got = quantize_activation(x, P.MXFP4)
    assert got.shape == x.shape
    assert torch.equal(got.reshape(10, 64), quantize_weight(x.reshape(10, 64), P.MXFP4).dequant)


def test_dtype_is_preserved():
    x = _x().to(torch.bfloat16)
    assert quantize_activation(x, P.FP8_E4M3).dtype == torch.bfloat16


@pytest.mark.parametrize("precision", [P.INT4A8_G32, P.INT4A8_G64, P.INT4A8_G128, P.INT8A8_G128])
def test_block_int8_activations_follow_mlas_comp_int8(precision):
    """ORT MatMulNBits accuracy_level 4 (MLAS QuantizeARow_CompInt8): per block of g along K,
    scale = amax / 127 and codes = round_half_even(x * (127 / amax))."""
    g = precision.info.act_group
    x = _x((3, 2, 200), seed=4)  # K = 200: a ragged last block for every g
    x[0, 0, :g] = 0.0  # an all-zero block stays zero
    got = quantize_activation(x, precision)
    rows = x.reshape(-1, 200)
    want = torch.empty_like(rows)
    for r in range(rows.shape[0]):
        for start in range(0, 200, g):
            blk = rows[r, start:start + g]
            amax = blk.abs().max()
            if amax == 0:
                want[r, start:start + g] = 0
                continue
            inv = torch.tensor(127.0) / amax  # one fp32 division, as MLAS computes it
            want[r, start:start + g] = torch.round(blk * inv) * (amax / 127.0)
    assert torch.equal(got, want.reshape(x.shape))
    # Per-block scales: a row's result does not depend on the other rows (batch-invariant).
    assert torch.equal(quantize_activation(x[1:2], precision), got[1:2])
    codes = got.reshape(-1, 200)[:, :g] / (rows[:, :g].abs().amax(-1, keepdim=True) / 127.0)
    assert torch.all(codes[1:].round().abs() <= 127)
