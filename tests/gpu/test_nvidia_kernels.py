"""Real NVIDIA kernels on autoplan.quant's weights against the simulated layer they run."""

from __future__ import annotations

import pytest
import torch

from autoplan.backends.nvidia import kernels as K
from autoplan.formats import Choice, Precision, Sparsity
from autoplan.prune import check_block, check_nm, compute_mask
from autoplan.quant import quantize_activation, quantize_weight

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.version.hip is not None, reason="NVIDIA kernels (ROCm uses e4m3fnuz and hipSPARSELt)"),
]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _pruned_2_4(w: torch.Tensor) -> torch.Tensor:
    return compute_mask(w, Sparsity.parse("2:4")).mask


def test_semi_structured_bf16_matches_masked_dense():
    w = torch.randn(256, 512, device="cuda")
    q = quantize_weight(w, Precision.BF16, mask=_pruned_2_4(w))
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    y = torch.nn.functional.linear(x, K.to_semi_structured(q.dequant.bfloat16()))
    assert _rel_err(y, x.float() @ q.dequant.T) < 1e-2


def test_fp8_linear_matches_the_simulated_layer():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need SM89+")
    x = torch.randn(33, 256, device="cuda", dtype=torch.bfloat16)
    q = quantize_weight(torch.randn(128, 256, device="cuda"), Precision.FP8_E4M3)
    bias = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    y = K.fp8_linear(x, q, bias)
    ref = quantize_activation(x.float(), Precision.FP8_E4M3) @ q.dequant.T + bias.float()
    assert y.dtype == torch.bfloat16 and _rel_err(y, ref) < 1e-2


def test_fp8_sparse_linear_matches_the_simulated_layer():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuSPARSELt fp8 needs SM90 in torch 2.13")
    w = torch.randn(128, 256, device="cuda")
    q = quantize_weight(w, Precision.FP8_E4M3, mask=_pruned_2_4(w))
    x = torch.randn(5, 256, device="cuda", dtype=torch.bfloat16)
    y = K.fp8_sparse_linear(x, K.compress_2_4_fp8(q))
    ref = quantize_activation(x.float(), Precision.FP8_E4M3) @ q.dequant.T
    assert y.shape == (5, 128) and _rel_err(y, ref) < 1e-2


def test_nvfp4_linear_matches_the_simulated_layer_or_says_why_not():
    reason = K.nvfp4_unavailable_reason()
    q = quantize_weight(torch.randn(128, 256, device="cuda"), Precision.NVFP4)
    w = K.pack_nvfp4(q)
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    if reason:
        with pytest.raises(Exception, match="NVFP4"):
            K.nvfp4_linear(x, w)
        return
    ref = quantize_activation(x.float(), Precision.NVFP4) @ q.dequant.T
    assert _rel_err(K.nvfp4_linear(x, w), ref) < 1e-2


@pytest.mark.parametrize("choice", ["dense+bf16", "dense+fp8_e4m3", "2:4+bf16", "2:4+fp8_e4m3",
                                    "dense+nvfp4", "block32@50+bf16", "block32@50+int8",
                                    "block64@50+fp8_e4m3"])
def test_microbenchmark_kernels_compute_x_at_the_masked_weight(choice):
    """Every GPU microbenchmark kernel computes x_sim @ W_masked.T, W_masked being the weight
    autoplan.prune + autoplan.quant make: the timed kernel runs the measured numerics."""
    from autoplan.backends import microbench as MB

    c = Choice.parse(choice)
    dev = torch.device("cuda")
    try:
        build, _ = MB.prepare_linear(c, dev)
        w = torch.randn(256, 512, device=dev) * 0.02
        layer = build(w)
    except Exception as err:  # noqa: BLE001 - a kernel this GPU lacks says so in one line
        if "needs" in str(err) or "SM" in str(err):
            pytest.skip(str(err).splitlines()[0])
        raise
    # The reference is built here, not by MB.compress_for (which the kernel's build uses,
    # so a bug there would sit on both sides): autoplan.prune's mask, checked against the
    # pattern, the masked weight W_masked = w * mask, then autoplan.quant's rounding of it.
    mask = None
    if c.sparsity.kind != "dense":
        mask = compute_mask(w, c.sparsity).mask
        assert (check_nm(mask, c.sparsity.n, c.sparsity.m) if c.sparsity.kind == "nm"
                else check_block(mask, c.sparsity.block))
        assert abs(float(mask.float().mean()) - (1 - c.sparsity.ratio)) < 0.02
    w_masked = w if mask is None else w * mask
    x = torch.randn(48, 512, device=dev, dtype=torch.bfloat16)
    if c.precision in (Precision.BF16, Precision.FP16, Precision.FP32):
        want = x.float() @ w_masked.float().T  # nothing rounds but the kernel's dtype
    else:
        q = quantize_weight(w.float(), c.precision, mask=mask)  # rounds the kept weights
        assert mask is None or bool((q.dequant[~mask] == 0).all())  # ... and only those
        want = quantize_activation(x.float(), c.precision) @ q.dequant.float().T
    assert _rel_err(layer(x), want) < 1e-2
