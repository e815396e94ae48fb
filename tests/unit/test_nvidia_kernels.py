"""CPU-checkable parts of the NVIDIA kernels: packing autoplan.quant's weights, layouts, errors."""

from __future__ import annotations

import pytest
import torch

from autoplan.backends.nvidia import kernels as K
from autoplan.errors import AutoplanError, UserInputError
from autoplan.formats import Choice, Precision, Sparsity
from autoplan.prune import compute_mask
from autoplan.quant import quantize_activation, quantize_weight

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")


def _q(w: torch.Tensor, text: str, mask: torch.Tensor | None = None):  # noqa: ANN202
    return quantize_weight(w, Choice.parse(text).precision, mask=mask)


def test_2_4_check_reads_autoplan_prune_masks():
    w = torch.randn(16, 32)
    mask = compute_mask(w, Sparsity.parse("2:4")).mask
    assert K.is_2_4_sparse(w * mask)
    assert not K.is_2_4_sparse(torch.ones(4, 8))
    assert not K.is_2_4_sparse(torch.ones(4, 6))


def test_fp8_inputs_are_autoplan_quant_per_token_rounding():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    codes, scale = K.fp8_inputs(x)
    assert codes.dtype == torch.float8_e4m3fn
    assert scale[0] == pytest.approx(2.0 / 448)
    assert codes[0, 1].float() == -448.0
    assert codes[1].float().abs().sum() == 0  # an all-zero row stays zero, not NaN
    want = quantize_activation(x, Precision.FP8_E4M3)
    assert torch.equal(codes.float() * scale[:, None], want)


def test_rowwise_scaled_mm_core_equals_the_simulated_layer():
    # torch 2.13 runs row-wise _scaled_mm on CPU too: the kernel core, fed autoplan.quant's
    # weight and inputs, computes what SimulatedLinear computes (to fp32 summation order)
    x = torch.randn(5, 64)
    q = _q(torch.randn(32, 64), "fp8_e4m3")
    y = K._fp8_rowwise_mm(x, q.codes, q.scales["weight_scale"].reshape(-1), torch.float32)
    ref = quantize_activation(x, Precision.FP8_E4M3) @ q.dequant.T
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_kernels_refuse_weights_of_another_format():
    with pytest.raises(UserInputError, match="fp8_e4m3 QuantizedWeight"):
        K.fp8_linear(torch.randn(2, 32), _q(torch.randn(32, 32), "int8"))
    with pytest.raises(UserInputError, match="nvfp4 QuantizedWeight"):
        K.pack_nvfp4(_q(torch.randn(32, 32), "mxfp4"))


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
        lambda: K.fp8_linear(torch.randn(2, 32), _q(torch.randn(32, 32), "fp8_e4m3")),
        lambda: K.compress_2_4_fp8(_q(torch.randn(32, 32), "2:4+fp8_e4m3")),
        lambda: K.fp8_sparse_linear(torch.randn(2, 32), K.Fp8Sparse24Weight(torch.zeros(1), torch.ones(32), (32, 32))),
        lambda: K.nvfp4_linear(torch.randn(2, 32), K.pack_nvfp4(_q(torch.randn(32, 32), "nvfp4"))),
    ],
)
def test_every_kernel_says_in_one_line_that_cuda_is_missing(call):
    with pytest.raises(AutoplanError, match="needs an NVIDIA GPU") as err:
        call()
    assert "\n" not in str(err.value)


@no_cuda
def test_nvfp4_reason_without_gpu():
    assert "GPU" in K.nvfp4_unavailable_reason()


def test_nvfp4_packing_holds_autoplan_quant_weights_and_the_global_scale_convention():
    """pack_nvfp4 packs quantize_weight's codes, even column in the low nibble, and keeps
    autoplan's g = 448 * 6 / amax, dequantized as (q * s) / g -- the convention the GEMM
    epilogue divides by (there is no second NVFP4 quantizer with the inverse g)."""
    t = torch.zeros(1, 16)
    t[0, 0], t[0, 1] = 6.0, -0.5
    q = _q(t, "nvfp4")
    p = K.pack_nvfp4(q)
    assert p.codes.shape == (1, 8) and p.block_scale.shape == (1, 1)
    assert int(p.codes[0, 0]) == int(q.codes[0, 0]) | (int(q.codes[0, 1]) << 4)
    assert float(p.global_scale) == pytest.approx(448 * 6 / 6.0)
    w = torch.randn(8, 64)
    q = _q(w, "nvfp4")
    assert torch.equal(K.dequantize_nvfp4(K.pack_nvfp4(q)), q.dequant)
    x = torch.randn(3, 64)
    assert torch.equal(K.dequantize_nvfp4(K.nvfp4_inputs(x)), quantize_activation(x, Precision.NVFP4))


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
