"""Scores: Wanda vs magnitude, and SparseGPT reconstruction vs plain magnitude pruning."""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.formats import Sparsity
from autoplan.prune import check_block, check_nm, compute_mask
from autoplan.quant import hessian_from_inputs


def _data(n_tokens=512, n_in=128, n_out=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(n_in, n_in, generator=gen) / n_in**0.5 + torch.eye(n_in)
    x = torch.randn(n_tokens, n_in, generator=gen) @ mix * torch.linspace(0.1, 4.0, n_in)
    return x, torch.randn(n_out, n_in, generator=gen)


def _out_err(x, w, wp):
    return float(((x @ w.T - x @ wp.float().T) ** 2).mean())


def test_wanda_differs_from_magnitude_with_skewed_norms():
    x, w = _data()
    act_norm = x.norm(dim=0)
    mag = compute_mask(w, Sparsity.parse("unstructured@50"))
    wanda = compute_mask(w, Sparsity.parse("unstructured@50"), score="wanda", act_norm=act_norm)
    assert not torch.equal(mag.mask, wanda.mask)
    assert wanda.mask.sum() == mag.mask.sum()
    assert _out_err(x, w, wanda.weight) < _out_err(x, w, mag.weight)
    # strongly activated inputs keep more weights under Wanda
    assert wanda.mask[:, 64:].sum() > mag.mask[:, 64:].sum()


@pytest.mark.parametrize("text", ["unstructured@50", "2:4", "block16@50", "channel@25"])
def test_sparsegpt_reconstructs_better_than_magnitude(text):
    x, w = _data()
    sp = Sparsity.parse(text)
    h = hessian_from_inputs(x)
    sgpt = compute_mask(w, sp, score="sparsegpt", hessian=h)
    mag = compute_mask(w, sp)
    assert sgpt.weight[~sgpt.mask].eq(0).all()
    assert abs(sgpt.density - mag.density) < 1e-6
    assert _out_err(x, w, sgpt.weight) <= _out_err(x, w, mag.weight)
    if sp.kind == "nm":
        assert check_nm(sgpt.mask, 2, 4)
    if sp.kind == "block":
        assert check_block(sgpt.mask, 16)


def test_sparsegpt_keeps_dtype_and_updates_kept_weights():
    x, w = _data(n_in=64, n_out=16)
    res = compute_mask(
        w.to(torch.bfloat16),
        Sparsity.parse("2:4"),
        score="sparsegpt",
        hessian=hessian_from_inputs(x),
    )
    assert res.weight.dtype == torch.bfloat16
    assert not torch.equal(res.weight.float()[res.mask], w.to(torch.bfloat16).float()[res.mask])


def test_missing_statistics_are_user_errors():
    _, w = _data(n_in=16, n_out=4)
    sp = Sparsity.parse("2:4")
    with pytest.raises(UserInputError, match="act_norm"):
        compute_mask(w, sp, score="wanda")
    with pytest.raises(UserInputError, match="one activation norm"):
        compute_mask(w, sp, score="wanda", act_norm=torch.ones(8))
    with pytest.raises(UserInputError, match="Hessian"):
        compute_mask(w, sp, score="sparsegpt")
    with pytest.raises(UserInputError, match="score"):
        compute_mask(w, sp, score="random")
