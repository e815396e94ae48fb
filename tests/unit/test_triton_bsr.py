"""The BSR format and the Triton block-sparse kernel, run through Triton's CPU interpreter.

CPU tensors always take the interpreted kernel (the module builds it explicitly), so no
TRITON_INTERPRET setting is needed here; shapes stay tiny so each case takes well under a second.
"""

from __future__ import annotations

import pytest
import torch

from autoplan.backends.amd.triton_bsr import (
    BsrWeight,
    block_mask_of,
    bsr_linear,
    bsr_linear_reference,
    quantize_inputs,
    to_e4m3fnuz,
)
from autoplan.errors import UserInputError
from autoplan.formats import Precision, Sparsity
from autoplan.prune import compute_mask
from autoplan.quant import SimulatedLinear, quantize_weight

pytest.importorskip("triton")

# bf16 outputs may differ by one bf16 ulp (2**-7 relative): fp32 summation order and the
# interpreter's rounding of the final cast
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2**-7, atol=1e-2),
}


def _tiles(w: torch.Tensor, block: int, ratio: float) -> torch.Tensor:
    """autoplan.prune's magnitude block mask of `w`, as BSR tiles."""
    if ratio == 0:
        return torch.ones(w.shape[0] // block, w.shape[1] // block, dtype=torch.bool)
    keep = compute_mask(w, Sparsity.parse(f"block{block}@{ratio * 100:g}")).mask
    return block_mask_of(keep.float(), block)


def _weight(out: int, inp: int, block: int, ratio: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=gen)
    return w, _tiles(w, block, ratio)


_PREC = {torch.int8: Precision.INT8, torch.float8_e4m3fn: Precision.FP8_E4M3}


def _quantized(w: torch.Tensor, mask: torch.Tensor, block: int, dtype: torch.dtype) -> BsrWeight:
    """The BSR weight of autoplan.quant's weights of the block-masked `w`."""
    keep = mask.repeat_interleave(block, 0).repeat_interleave(block, 1)
    q = quantize_weight(w, _PREC[dtype], mask=keep)
    return BsrWeight.from_quantized(q, block, block_mask=mask)


@pytest.mark.parametrize("block", [16, 32, 64])
def test_from_dense_round_trip_keeps_exactly_the_masked_tiles(block):
    w, mask = _weight(128, 128, block, 0.5)
    bsr = BsrWeight.from_dense(w, block, block_mask=mask)
    expected = w * mask.repeat_interleave(block, 0).repeat_interleave(block, 1)
    assert torch.equal(bsr.to_dense(), expected)
    assert torch.equal(bsr.block_mask(), mask)
    assert bsr.nnz_blocks == int(mask.sum())
    assert bsr.density == pytest.approx(0.5)
    assert bsr.row_ptr.tolist()[-1] == bsr.nnz_blocks


def test_default_mask_is_the_zero_pattern_of_the_weight():
    w = torch.zeros(64, 64)
    w[0, 40] = 1.0  # tile (0, 2) for block 16
    w[63, 0] = 2.0  # tile (3, 0)
    bsr = BsrWeight.from_dense(w, 16)
    assert bsr.nnz_blocks == 2
    assert bsr.row_ptr.tolist() == [0, 1, 1, 1, 2]
    assert bsr.col_indices.tolist() == [2, 0]
    assert torch.equal(block_mask_of(w, 16), bsr.block_mask())


def test_prune_block_masks_are_balanced_per_row_and_keep_the_largest_tiles():
    w = torch.ones(32, 64)
    w[:16, 16:32] = 10.0
    mask = _tiles(w, 16, 0.75)
    assert mask.sum(dim=1).tolist() == [1, 1]
    assert mask[0, 1]


@pytest.mark.parametrize("precision", ["int8", "fp8_e4m3"])
def test_reference_computes_the_simulated_layer(precision):
    """The kernel's math, on the weight autoplan.prune + autoplan.quant make, equals what
    SimulatedLinear computes for block32@50 (to summation order)."""
    w, mask = _weight(64, 128, 32, 0.5, seed=5)
    prec = Precision.parse(precision)
    dtype = {Precision.INT8: torch.int8, Precision.FP8_E4M3: torch.float8_e4m3fn}[prec]
    bsr = _quantized(w, mask, 32, dtype)
    keep = mask.repeat_interleave(32, 0).repeat_interleave(32, 1)
    lin = torch.nn.Linear(128, 64, bias=False)
    lin.weight.data = w
    from autoplan.formats import Choice

    sim = SimulatedLinear.from_linear(lin, Choice.parse(f"block32@50+{precision}"), mask=keep)
    x = torch.randn(9, 128)
    torch.testing.assert_close(bsr_linear_reference(x, bsr), sim(x), rtol=1e-5, atol=1e-5)


def test_fnuz_conversion_is_exact():
    w, mask = _weight(32, 64, 32, 0.0, seed=6)
    q = quantize_weight(w, Precision.FP8_E4M3)
    codes, scale = to_e4m3fnuz(q.codes, q.scales["weight_scale"].reshape(-1))
    assert codes.dtype == torch.float8_e4m3fnuz
    assert torch.equal(codes.float() * scale[:, None], q.dequant)


@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_kernel_matches_reference(block, dtype):
    w, mask = _weight(128, 128, block, 0.5, seed=block)
    bsr = BsrWeight.from_dense(w.to(dtype), block, block_mask=mask)
    x = torch.randn(24, 128).to(dtype)
    bias = torch.randn(128).to(dtype)
    y = bsr_linear(x, bsr, bias)
    assert y.dtype == dtype and y.shape == (24, 128)
    torch.testing.assert_close(y, bsr_linear_reference(x, bsr, bias), **TOL[dtype])
    # and the reference is the plain masked dense product
    dense = (x.float() @ bsr.to_dense().float().T + bias.float()).to(dtype)
    torch.testing.assert_close(bsr_linear_reference(x, bsr, bias), dense, **TOL[dtype])


@pytest.mark.parametrize("block", [16, 32, 64])
def test_int8_kernel_is_bit_exact_against_reference(block):
    w, mask = _weight(64, 128, block, 0.5, seed=1)
    bsr = _quantized(w, mask, block, torch.int8)
    assert bsr.values.dtype == torch.int8 and bsr.scale.shape == (64,)
    x = torch.randn(8, 128)
    bias = torch.randn(64)
    # int32 accumulation is exact, scales are applied in the same order: identical bits
    assert torch.equal(bsr_linear(x, bsr, bias), bsr_linear_reference(x, bsr, bias))


@pytest.mark.parametrize("block", [16, 32, 64])
def test_fp8_kernel_matches_reference(block):
    w, mask = _weight(64, 128, block, 0.5, seed=2)
    bsr = _quantized(w, mask, block, torch.float8_e4m3fn)
    x = torch.randn(17, 128)  # M not a multiple of the tile: exercises the row clamp
    y = bsr_linear(x, bsr)
    torch.testing.assert_close(y, bsr_linear_reference(x, bsr), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_quantized_reference_is_close_to_the_float_product(dtype):
    w, mask = _weight(64, 64, 32, 0.5, seed=3)
    bsr = _quantized(w, mask, 32, dtype)
    x = torch.randn(16, 64)
    exact = x @ (w * mask.repeat_interleave(32, 0).repeat_interleave(32, 1)).T
    err = (bsr_linear_reference(x, bsr) - exact).norm() / exact.norm()
    assert err < 0.05  # W8A8 quantization noise, not a layout error


def test_bf16_activations_with_fp8_weights_give_bf16_output():
    w, mask = _weight(64, 64, 16, 0.5, seed=4)
    bsr = _quantized(w, mask, 16, torch.float8_e4m3fn)
    x = torch.randn(16, 64).to(torch.bfloat16)
    y = bsr_linear(x, bsr)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, bsr_linear_reference(x, bsr), **TOL[torch.bfloat16])


def test_empty_row_blocks_give_zero_or_bias():
    w, _ = _weight(64, 64, 16, 0.0)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[1, 2] = True  # row-blocks 0, 2, 3 empty
    bsr = BsrWeight.from_dense(w, 16, block_mask=mask)
    x = torch.randn(16, 64)
    bias = torch.randn(64)
    y = bsr_linear(x, bsr, bias)
    torch.testing.assert_close(y, bsr_linear_reference(x, bsr, bias))
    torch.testing.assert_close(y[:, :16], bias[:16].expand(16, 16))
    assert torch.equal(bsr_linear(x, BsrWeight.from_dense(torch.zeros(64, 64), 16)), torch.zeros(16, 64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_full_density_equals_dense_matmul(dtype):
    w = torch.randn(64, 96)
    full = torch.ones(2, 3, dtype=torch.bool)
    bsr = BsrWeight.from_dense(w, 32) if dtype == torch.float32 else _quantized(w, full, 32, dtype)
    assert bsr.density == 1.0
    x = torch.randn(9, 96)
    y = bsr_linear(x, bsr)
    torch.testing.assert_close(y, bsr_linear_reference(x, bsr), rtol=1e-5, atol=1e-5)
    if dtype == torch.float32:
        torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-4)


def test_inputs_are_autoplan_quant_per_token_rounding():
    t = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    codes, scale = quantize_inputs(t, Precision.INT8)
    assert codes.tolist() == [[0, 0], [64, -127]]
    assert scale[1] == pytest.approx(2.0 / 127)
    codes8, s8 = quantize_inputs(t, Precision.FP8_E4M3)
    assert codes8.dtype == torch.float8_e4m3fn and codes8.float().abs().max() == 448.0
    fnuz, scale_nuz = quantize_inputs(t, Precision.FP8_E4M3, fnuz=True)
    assert fnuz.dtype == torch.float8_e4m3fnuz and torch.equal(fnuz.float() * scale_nuz[:, None],
                                                               codes8.float() * s8[:, None])
    with pytest.raises(UserInputError, match="not nvfp4"):
        quantize_inputs(t, Precision.NVFP4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: BsrWeight.from_dense(torch.randn(64, 64), 8),
        lambda: BsrWeight.from_dense(torch.randn(64, 60), 16),
        lambda: BsrWeight.from_dense(torch.randn(64, 64), 16, block_mask=torch.ones(2, 2, dtype=torch.bool)),
        lambda: BsrWeight.from_dense(torch.randn(64, 64), 16, dtype=torch.int8),
        lambda: BsrWeight.from_quantized(quantize_weight(torch.randn(64, 64), Precision.INT4_G32), 16),
        lambda: bsr_linear(torch.randn(4, 32), BsrWeight.from_dense(torch.randn(64, 64), 16)),
        lambda: bsr_linear(torch.randn(4, 64).bfloat16(), BsrWeight.from_dense(torch.randn(64, 64), 16)),
    ],
)
def test_bad_input_raises_user_input_error(make):
    with pytest.raises(UserInputError):
        make()
