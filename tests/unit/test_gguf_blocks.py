"""GGUF block formats: quantize -> dequantize and the stored bytes bit-equal to gguf.quants;
activations rounded as ggml-cpu's quantize_row_q8_0/_q8_1; the Q8_1 block-sum term."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoplan.formats import Choice, Precision
from autoplan.quant import SimulatedLinear, gptq_quantize, quantize_weight
from autoplan.quant.activations import quantize_activation
from autoplan.formats.gguf_blocks import GgufWeightScheme, gguf_formats, pack_blocks, roundf

FORMATS = gguf_formats()

gguf = pytest.importorskip("gguf")
GGUF_PRECISIONS = list(FORMATS)


def _weights(rows: int = 48, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """Random weights plus the blocks where rounding rules differ: all zero, constant, a
    +a/-a tie for the largest magnitude, an outlier, values on .5 boundaries."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    w[0, :32] = 0.0
    w[1, :32] = 0.3
    w[2, :32] = torch.linspace(-0.2, 0.2, 32)
    w[2, 3], w[2, 9] = 0.25, -0.25  # equal magnitude: the first one sets the sign of d
    w[3, 40] = 4.0
    w[4, :32] = torch.arange(32) / 2.0 - 8.0  # exact halves on the q8_0 grid of amax 8
    w[5, :32] = -w[5, :32].abs()
    return w


@pytest.mark.parametrize("precision", GGUF_PRECISIONS, ids=lambda p: p.value)
def test_dequantized_weights_and_bytes_equal_gguf_quants(precision):
    fmt = FORMATS[precision]
    qtype = gguf.GGMLQuantizationType[fmt.ggml_type]
    for seed in range(3):
        w = _weights(seed=seed)
        qw = quantize_weight(w, precision)
        ref = gguf.quantize(w.numpy(), qtype)
        assert torch.equal(qw.dequant, torch.from_numpy(gguf.dequantize(ref, qtype)))
        packed = pack_blocks(qw.codes, qw.scales["weight_scale"], qw.scales.get("weight_min"), fmt)
        assert packed.shape == ref.shape and np.array_equal(packed, ref)
        assert qw.scales["weight_scale"].dtype == torch.float16
        assert ("weight_min" in qw.scales) == fmt.has_min


def test_type_sizes_match_gguf():
    for fmt in FORMATS.values():
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt.ggml_type]]
        assert (block, size) == (32, fmt.type_size)
    for precision, fmt in FORMATS.items():
        assert precision.info.weight_bits == fmt.type_size * 8 / 32


def test_roundf_is_c_roundf():
    x = torch.tensor([0.49999997, 0.5, -0.5, 1.5, 2.5, -2.5, 126.5, -0.49999997, 0.0])
    assert roundf(x).tolist() == [0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 127.0, -0.0, 0.0]
    ref = gguf.quants.np_roundf(x.numpy())
    assert np.array_equal(roundf(x).numpy(), ref)


def test_activations_round_half_even_with_an_fp16_scale():
    # amax 127 -> the multiplier 127 / amax is exactly 1, so x * id keeps the .5 ties
    x = torch.zeros(1, 32)
    x[0, :5] = torch.tensor([127.0, 2.5, 3.5, -2.5, 0.3])
    got = quantize_activation(x, Precision.Q4_0)
    assert got[0, :5].tolist() == [127.0, 2.0, 4.0, -2.0, 0.0]  # scale fp16(1.0) = 1
    # a scale that fp16 cannot hold: values are fp16(amax / 127) * code
    y = torch.full((1, 32), 0.1234567)
    d16 = torch.tensor(0.1234567 / 127).half().float()
    assert torch.equal(quantize_activation(y, Precision.Q8_0), torch.full((1, 32), 127.0) * d16)
    assert torch.equal(quantize_activation(torch.zeros(3, 64), Precision.Q4_1), torch.zeros(3, 64))


def _llama_cpp_dot(x: torch.Tensor, qw, precision: Precision) -> torch.Tensor:
    """ggml's *_1 x Q8_1 dot in float64: sum_b d_w d_a sum(q_w q_a) + m_w s_a, with
    s_a = fp16(d_a * sum(q_a)) (ggml-cpu quantize_row_q8_1, vec_dot_q4_1_q8_1)."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    amax = blocks.float().abs().amax(-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    qa = torch.round(blocks.float() * inv).double()
    s = (d.squeeze(-1) * qa.sum(-1).float()).half().double()
    da = d.half().double()
    dw = qw.scales["weight_scale"].double()
    mw = qw.scales["weight_min"].double()
    qw_codes = qw.codes.double().reshape(qw.codes.shape[0], -1, 32)
    sumi = torch.einsum("tbk,obk->tob", qa, qw_codes)
    return (sumi * dw[None] * da.squeeze(-1)[:, None]).sum(-1) + s @ mw.t()


@pytest.mark.parametrize("precision", [Precision.Q4_1, Precision.Q5_1], ids=lambda p: p.value)
def test_star_1_layers_use_the_q8_1_block_sums(precision):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 256, generator=gen) * 0.05 + 0.02
    x = torch.randn(6, 256, generator=gen) * 3 + 1
    lin = torch.nn.Linear(256, 64, bias=False)
    lin.weight.data = w
    sim = SimulatedLinear.from_linear(lin, Choice.parse(precision.value))
    ref = _llama_cpp_dot(x, sim.quantized, precision)
    scale = ref.abs().max()
    assert ((sim(x).double() - ref).abs().max() / scale) < 2e-6
    plain = quantize_activation(x, precision).double() @ sim.weight.double().t()
    assert ((plain - ref).abs().max() / scale) > 2e-5  # the term the correction supplies


@pytest.mark.parametrize("precision", GGUF_PRECISIONS, ids=lambda p: p.value)
def test_gptq_stays_on_the_block_grid(precision):
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(16, 64, generator=gen) * 0.05
    x = torch.randn(128, 64, generator=gen)
    hessian = 2 * x.t() @ x / x.shape[0]
    deq, codes, scale, _ = gptq_quantize(w, hessian, GgufWeightScheme(FORMATS[precision]))
    stored = GgufWeightScheme(FORMATS[precision]).scale_dict(scale, None)
    d = stored["weight_scale"].float().repeat_interleave(32, dim=1)
    expect = d * codes + (stored["weight_min"].float().repeat_interleave(32, dim=1)
                          if "weight_min" in stored else 0.0)
    assert torch.equal(deq, expect)
    rtn = quantize_weight(w, precision).dequant
    assert ((deq - w) @ hessian * (deq - w)).sum() <= ((rtn - w) @ hessian * (rtn - w)).sum()
