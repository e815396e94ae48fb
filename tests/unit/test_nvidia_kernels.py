"""CPU-checkable parts of the NVIDIA kernels: pruning, scales, FP4 packing, layouts, errors."""

from __future__ import annotations

import pytest
import torch

from autoplan.backends.nvidia import kernels as K
from autoplan.errors import AutoplanError, UserInputError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")


def test_prune_2_4_keeps_the_two_largest_of_every_four():
    w = torch.tensor([[1.0, -5.0, 3.0, 0.5, 0.0, 0.0, 2.0, -1.0]])
    assert K.prune_2_4(w).tolist() == [[0.0, -5.0, 3.0, 0.0, 0.0, 0.0, 2.0, -1.0]]
    assert K.is_2_4_sparse(K.prune_2_4(torch.randn(16, 32)))
    assert not K.is_2_4_sparse(torch.ones(4, 8))
    with pytest.raises(UserInputError):
        K.prune_2_4(torch.randn(4, 6))


def test_rowwise_fp8_scales_map_row_max_to_448():
    t = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    codes, scale = K.quantize_fp8_rowwise(t)
    assert codes.dtype == torch.float8_e4m3fn
    assert scale[0] == pytest.approx(2.0 / 448)
    assert codes[0, 1].float() == -448.0
    assert codes[1].float().abs().sum() == 0  # an all-zero row stays zero, not NaN
    torch.testing.assert_close(codes.float() * scale[:, None], t, rtol=0.07, atol=0)


def test_rowwise_scaled_mm_core_matches_the_dequantized_product():
    # torch 2.13 runs row-wise _scaled_mm on CPU too: this checks our layouts and scale shapes
    x = torch.randn(5, 64)
    w_codes, w_scale = K.quantize_fp8_rowwise(torch.randn(32, 64))
    y = K._fp8_rowwise_mm(x, w_codes, w_scale, torch.float32)
    xq, xs = K.quantize_fp8_rowwise(x)
    ref = (xq.float() @ w_codes.float().T) * xs[:, None] * w_scale[None, :]
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "args",
    [
        (torch.randn(4, 64), torch.randn(32, 64), torch.ones(32)),  # weight not fp8
        (torch.randn(4, 48), torch.zeros(32, 64, dtype=torch.float8_e4m3fn), torch.ones(32)),
        (torch.randn(4, 40), torch.zeros(32, 40, dtype=torch.float8_e4m3fn), torch.ones(32)),
        (torch.randn(4, 64), torch.zeros(32, 64, dtype=torch.float8_e4m3fn), torch.ones(1, 32)),
    ],
)
def test_fp8_argument_validation(args):
    with pytest.raises(UserInputError):
        K._fp8_rowwise_mm(*args, torch.bfloat16)


@no_cuda
@pytest.mark.parametrize(
    "call",
    [
        lambda: K.to_semi_structured(torch.randn(32, 32)),
        lambda: K.fp8_linear(torch.randn(2, 32), torch.zeros(32, 32, dtype=torch.float8_e4m3fn), torch.ones(32)),
        lambda: K.compress_2_4_fp8(torch.randn(32, 32)),
        lambda: K.fp8_sparse_linear(torch.randn(2, 32), K.Fp8Sparse24Weight(torch.zeros(1), torch.ones(32), (32, 32))),
        lambda: K.nvfp4_linear(torch.randn(2, 32), K.quantize_nvfp4(torch.randn(32, 32))),
    ],
)
def test_every_kernel_says_in_one_line_that_cuda_is_missing(call):
    with pytest.raises(AutoplanError, match="needs an NVIDIA GPU") as err:
        call()
    assert "\n" not in str(err.value)


@no_cuda
def test_nvfp4_reason_without_gpu():
    assert "GPU" in K.nvfp4_unavailable_reason()


def test_e2m1_round_trip_and_ties_to_even():
    vals = torch.tensor(K.E2M1_VALUES + tuple(-v for v in K.E2M1_VALUES[1:]))
    assert torch.equal(K._e2m1_decode(K._e2m1_encode(vals)), vals)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0])
    expect = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0])
    assert torch.equal(K._e2m1_decode(K._e2m1_encode(ties)), expect)


def test_nvfp4_quantize_packs_even_columns_low_and_round_trips():
    t = torch.zeros(1, 16)
    t[0, 0], t[0, 1] = 6.0, -0.5  # codes 7 and 0b1001 = 9
    q = K.quantize_nvfp4(t)
    assert q.codes.shape == (1, 8) and q.block_scale.shape == (1, 1)
    assert int(q.codes[0, 0]) == 7 | (9 << 4)
    torch.testing.assert_close(K.dequantize_nvfp4(q), t)
    x = torch.randn(8, 64)
    err = (K.dequantize_nvfp4(K.quantize_nvfp4(x)) - x).norm() / x.norm()
    assert err < 0.15  # 4-bit quantization noise; a packing error would be ~1


def test_blocked_scale_layout_matches_the_cublas_tile_formula():
    rows, cols = 130, 6  # padding on both sides: 2 row tiles, 2 column tiles
    scales = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    out = K.to_blocked_scales(scales)
    col_tiles = 2
    assert out.numel() == 256 * 8
    for r, c in [(0, 0), (5, 3), (31, 1), (32, 0), (127, 3), (128, 4), (129, 5)]:
        tile = (r // 128) * col_tiles + c // 4
        pos = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        assert out[pos] == scales[r, c]
    assert out.sum() == scales.sum()  # everything else is zero padding
