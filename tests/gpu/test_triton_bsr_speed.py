"""The compiled Triton block-sparse kernel on a GPU: correct, and not slower than it should be."""

from __future__ import annotations

import pytest
import torch

from autoplan.backends.amd.triton_bsr import (
    BsrWeight,
    block_mask_of,
    bsr_linear,
    bsr_linear_reference,
)
from autoplan.formats import Precision, Sparsity
from autoplan.prune import compute_mask
from autoplan.quant import quantize_weight

pytestmark = pytest.mark.gpu


def _kept(w: torch.Tensor, block: int) -> torch.Tensor:
    """autoplan.prune's 50% block mask (elementwise)."""
    return compute_mask(w, Sparsity.parse(f"block{block}@50")).mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("block", [16, 32, 64])
def test_compiled_kernel_matches_reference(block, dtype):
    pytest.importorskip("triton")
    w = torch.randn(512, 1024, device="cuda")
    keep = _kept(w, block)
    mask = block_mask_of(keep.float(), block)
    if dtype == torch.bfloat16:
        bsr = BsrWeight.from_dense((w * keep).bfloat16(), block, block_mask=mask)
    else:
        prec = Precision.INT8 if dtype == torch.int8 else Precision.FP8_E4M3
        bsr = BsrWeight.from_quantized(quantize_weight(w, prec, mask=keep), block, block_mask=mask)
    x = torch.randn(100, 1024, device="cuda", dtype=torch.bfloat16)
    y, ref = bsr_linear(x, bsr), bsr_linear_reference(x, bsr)
    assert float((y.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


def test_half_density_is_faster_than_full_density_at_large_m():
    pytest.importorskip("triton")
    from autoplan.backends.microbench import time_callable

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    full = BsrWeight.from_dense(w, 64)
    half = BsrWeight.from_dense(w, 64, block_mask=block_mask_of(_kept(w, 64).float(), 64))
    t_full = time_callable(lambda: bsr_linear(x, full), "cuda", repeats=20, warmup=5).median_us
    t_half = time_callable(lambda: bsr_linear(x, half), "cuda", repeats=20, warmup=5).median_us
    # the kernel skips dropped tiles: half the tiles must cost clearly less than all of them
    assert t_half < 0.75 * t_full
