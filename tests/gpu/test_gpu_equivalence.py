"""What the GPU check's section a adds to tests/gpu: the FP4 simulations give the same bits on
CUDA as on CPU, the Triton block-sparse kernel computes the dense product of the masked
weight, and torch's INT8 / W4A16 kernels (benchmarks/gpu_kernels.py) compute the simulated
layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from autoplan.formats import Choice, Precision, Sparsity
from autoplan.prune import compute_mask
from autoplan.quant import quantize_activation, quantize_weight

pytestmark = pytest.mark.gpu


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("precision", [Precision.NVFP4, Precision.MXFP4])
def test_fp4_simulation_on_cuda_is_bit_equal_to_cpu(precision):
    gen = torch.Generator().manual_seed(0)
    # a spread of magnitudes (scales hit subnormal E4M3 / E8M0 corners) and exact ties
    w = torch.randn(256, 512, generator=gen) * torch.logspace(-4, 1, 512)
    w[0, :32] = torch.arange(32) * 0.25
    x = torch.randn(64, 512, generator=gen) * 3
    cpu_w = quantize_weight(w, precision)
    gpu_w = quantize_weight(w.cuda(), precision)
    assert torch.equal(gpu_w.dequant.cpu(), cpu_w.dequant)
    assert torch.equal(gpu_w.codes.cpu(), cpu_w.codes)
    for name, scale in cpu_w.scales.items():
        assert torch.equal(gpu_w.scales[name].cpu(), scale), name
    assert torch.equal(quantize_activation(x.cuda(), precision).cpu(),
                       quantize_activation(x, precision))


@pytest.mark.parametrize("block", [32, 64])
def test_triton_block_sparse_kernel_equals_the_dense_product_of_the_masked_weight(block):
    pytest.importorskip("triton")
    from autoplan.backends.amd.triton_bsr import BsrWeight, block_mask_of, bsr_linear

    w = torch.randn(512, 1024, device="cuda")
    keep = compute_mask(w, Sparsity.parse(f"block{block}@50")).mask
    masked = (w * keep).bfloat16()
    bsr = BsrWeight.from_dense(masked, block, block_mask=block_mask_of(keep.float(), block))
    x = torch.randn(77, 1024, device="cuda", dtype=torch.bfloat16)
    dense = torch.nn.functional.linear(x.float(), masked.float())
    assert _rel_err(bsr_linear(x, bsr), dense) < 1e-2


def _gpu_kernels():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_kernels.py"
    spec = importlib.util.spec_from_file_location("gpu_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("choice", ["dense+int8", "dense+int4_g128", "dense+int4_g64"])
@pytest.mark.parametrize("m", [1, 16, 100])
def test_torch_int8_and_w4a16_kernels_compute_the_simulated_layer(choice, m):
    c = Choice.parse(choice)
    w = torch.randn(256, 1024, device="cuda") * 0.02
    layer, _ = _gpu_kernels().build(c, w)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    q = quantize_weight(w, c.precision)
    want = quantize_activation(x.float(), c.precision) @ q.dequant.float().T
    assert _rel_err(layer(x), want) < 1e-2
