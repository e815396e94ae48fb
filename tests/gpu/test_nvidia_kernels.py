"""Real NVIDIA kernels against dense references computing the same quantized math."""

from __future__ import annotations

import pytest
import torch

from autoplan.backends.nvidia import kernels as K

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.version.hip is not None, reason="NVIDIA kernels (ROCm uses e4m3fnuz and hipSPARSELt)"),
]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_semi_structured_bf16_matches_masked_dense():
    w = K.prune_2_4(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    y = torch.nn.functional.linear(x, K.to_semi_structured(w))
    assert _rel_err(y, x @ w.T) < 1e-2


def test_fp8_linear_matches_quantized_reference():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need SM89+")
    x = torch.randn(33, 256, device="cuda", dtype=torch.bfloat16)
    w_codes, w_scale = K.quantize_fp8_rowwise(torch.randn(128, 256, device="cuda"))
    bias = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    y = K.fp8_linear(x, w_codes, w_scale, bias)
    xq, xs = K.quantize_fp8_rowwise(x)
    ref = (xq.float() @ w_codes.float().T) * xs[:, None] * w_scale[None, :] + bias.float()
    assert y.dtype == torch.bfloat16 and _rel_err(y, ref) < 1e-2


def test_fp8_sparse_linear_matches_quantized_reference():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuSPARSELt fp8 needs SM90 in torch 2.13")
    w = K.prune_2_4(torch.randn(128, 256, device="cuda"))
    x = torch.randn(5, 256, device="cuda", dtype=torch.bfloat16)
    ws = K.compress_2_4_fp8(w)
    y = K.fp8_sparse_linear(x, ws)
    w_codes, w_scale = K.quantize_fp8_rowwise(w)
    xq, xs = K.quantize_fp8_rowwise(x)
    ref = (xq.float() @ w_codes.float().T) * xs[:, None] * w_scale[None, :]
    assert y.shape == (5, 128) and _rel_err(y, ref) < 1e-2


def test_nvfp4_linear_matches_dequantized_reference_or_says_why_not():
    reason = K.nvfp4_unavailable_reason()
    w = K.quantize_nvfp4(torch.randn(128, 256, device="cuda"))
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    if reason:
        with pytest.raises(Exception, match="NVFP4"):
            K.nvfp4_linear(x, w)
        return
    ref = K.dequantize_nvfp4(K.quantize_nvfp4(x)) @ K.dequantize_nvfp4(w).T
    assert _rel_err(K.nvfp4_linear(x, w), ref) < 1e-2
