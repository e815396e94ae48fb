"""SimulatedLinear: prune, then quantize, then a forward equal to an explicit reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.prune import check_nm, compute_mask
from autoplan.quant import (
    SimulatedLinear,
    cast_fp8_e4m3,
    hessian_from_inputs,
    quantize_activation,
    quantize_weight,
)


def _layer(seed=0, n_in=64, n_out=16):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out)


def test_fp8_forward_equals_explicit_reference():
    lin = _layer()
    sim = SimulatedLinear.from_linear(lin, Choice.parse("dense+fp8_e4m3"))
    x = torch.randn(3, 5, 64)
    w = lin.weight.detach()
    ws = w.abs().amax(1, keepdim=True) / 448
    wq = cast_fp8_e4m3(w / ws) * ws
    xs = x.abs().amax(-1, keepdim=True) / 448
    xq = cast_fp8_e4m3(x / xs) * xs
    ref = xq @ wq.T + lin.bias.detach()
    assert torch.equal(sim(x), ref)


@pytest.mark.parametrize(
    "text",
    [
        "2:4+int8",
        "2:4+int4_g32",
        "unstructured@50+nvfp4",
        "block16@50+mxfp4",
        "dense+bf16",
        "2:4+fp32",
    ],
)
def test_forward_equals_pruned_quantized_reference(text):
    lin = _layer(1)
    choice = Choice.parse(text)
    mask = compute_mask(lin.weight.detach(), choice.sparsity).mask
    sim = SimulatedLinear.from_linear(lin, choice, mask=mask)
    q = quantize_weight(lin.weight.detach(), choice.precision, mask=mask)
    x = torch.randn(4, 64)
    ref = quantize_activation(x, choice.precision) @ q.dequant.float().T + lin.bias.detach()
    assert torch.equal(sim(x), ref)
    assert sim.weight[~mask].eq(0).all()
    assert torch.equal(sim.mask, mask)


def test_sparse_choice_without_mask_prunes_before_quantizing():
    lin = _layer(2)
    sim = SimulatedLinear.from_linear(lin, Choice.parse("2:4+int4_g32"))
    assert check_nm(sim.mask, 2, 4) and sim.weight[~sim.mask].eq(0).all()
    expected = quantize_weight(lin.weight.detach(), sim.choice.precision, mask=sim.mask)
    assert torch.equal(sim.quantized.dequant, expected.dequant)


def test_sparsegpt_and_gptq_path():
    lin = _layer(3)
    x = torch.randn(256, 64)
    h = hessian_from_inputs(x)
    sim = SimulatedLinear.from_linear(lin, Choice.parse("2:4+int4_g32"), hessian=h, method="gptq")
    assert check_nm(sim.mask, 2, 4) and sim.weight[~sim.mask].eq(0).all()
    out_err = (sim(x) - lin(x)).pow(2).mean()
    rtn = SimulatedLinear.from_linear(lin, Choice.parse("2:4+int4_g32"))
    assert out_err < (rtn(x) - lin(x)).pow(2).mean()


def test_bf16_input_gets_bf16_output():
    lin = _layer(4)
    sim = SimulatedLinear.from_linear(lin, Choice.parse("int8"))
    assert sim(torch.randn(2, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_mismatched_mask_is_a_user_error():
    with pytest.raises(UserInputError):
        SimulatedLinear.from_linear(
            _layer(), Choice.parse("int8"), mask=torch.ones(3, 3, dtype=torch.bool)
        )
