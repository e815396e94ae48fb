"""GPTQ: beats RTN on correlated inputs, equals RTN without correlations, honours masks."""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.formats import Precision
from autoplan.quant import HessianAccumulator, hessian_from_inputs, quantize_weight

P = Precision
QUANTIZED = [P.INT8, P.INT4_G32, P.INT4_G128, P.UINT4_G32, P.UINT4A8_G128, P.FP8_E4M3, P.NVFP4, P.MXFP4]


def _correlated(n_tokens: int = 512, n_in: int = 128, n_out: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(n_in, n_in, generator=gen) / n_in**0.5 + torch.eye(n_in)
    x = torch.randn(n_tokens, n_in, generator=gen) @ mix * torch.linspace(0.2, 3.0, n_in)
    w = torch.randn(n_out, n_in, generator=gen)
    return x, w


def _out_err(x, w, wq):
    return float(((x @ w.T - x @ wq.T) ** 2).mean())


@pytest.mark.parametrize("precision", QUANTIZED)
def test_gptq_output_error_not_above_rtn_on_correlated_inputs(precision):
    x, w = _correlated()
    h = hessian_from_inputs(x)
    rtn = quantize_weight(w, precision)
    gptq = quantize_weight(w, precision, method="gptq", hessian=h)
    assert _out_err(x, w, gptq.dequant) <= _out_err(x, w, rtn.dequant)


@pytest.mark.parametrize("precision", list(P))
def test_gptq_with_identity_hessian_equals_rtn(precision):
    _, w = _correlated(n_in=96, n_out=8)
    rtn = quantize_weight(w, precision)
    gptq = quantize_weight(w, precision, method="gptq", hessian=torch.eye(96))
    assert torch.equal(gptq.dequant, rtn.dequant)
    for name, scale in rtn.scales.items():
        assert torch.equal(gptq.scales[name].float(), scale.float()), name


def test_gptq_codes_and_scales_reproduce_dequant():
    x, w = _correlated()
    q = quantize_weight(w, P.INT4_G32, method="gptq", hessian=hessian_from_inputs(x))
    assert q.codes.min() >= -8 and q.codes.max() <= 7
    scale = q.scales["weight_scale"].repeat_interleave(32, 1)
    assert torch.equal(q.dequant, q.codes.float() * scale)


def test_gptq_keeps_pruned_weights_zero_and_compensates():
    x, w = _correlated(seed=1)
    h = hessian_from_inputs(x)
    mask = torch.rand(w.shape, generator=torch.Generator().manual_seed(2)) > 0.5
    rtn = quantize_weight(w, P.INT4_G32, mask=mask)
    gptq = quantize_weight(w, P.INT4_G32, method="gptq", hessian=h, mask=mask)
    assert gptq.dequant[~mask].eq(0).all() and gptq.codes[~mask].eq(0).all()
    assert _out_err(x, w, gptq.dequant) < _out_err(x, w, rtn.dequant)


def test_gptq_handles_dead_inputs_and_ragged_groups():
    x, w = _correlated(n_in=72, n_out=8)
    x[:, 5] = 0.0  # an input channel that never fires
    q = quantize_weight(w, P.INT4_G32, method="gptq", hessian=hessian_from_inputs(x))
    assert q.dequant[:, 5].eq(0).all()
    assert q.scales["weight_scale"].shape == (8, 3)


def test_hessian_accumulator_is_batch_independent():
    x, _ = _correlated(n_tokens=60, n_in=16)
    acc = HessianAccumulator(16)
    for chunk in x.split(7):
        acc.add(chunk)
    assert torch.allclose(acc.hessian, 2 * x.T @ x / 60, atol=1e-4)
    assert torch.allclose(acc.act_norm(), x.norm(dim=0), rtol=1e-4)
    with pytest.raises(UserInputError):
        acc.add(torch.ones(3, 8))


def test_gptq_rejects_mis_sized_hessian():
    with pytest.raises(UserInputError, match="Hessian"):
        quantize_weight(torch.randn(4, 32), P.INT8, method="gptq", hessian=torch.eye(16))
