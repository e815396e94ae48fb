"""Sparsity patterns: N:M, unstructured, block and channel masks, and the mask checks."""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import UserInputError
from autoplan.formats import Sparsity
from autoplan.prune import check_block, check_nm, compute_mask, select_keep


def _w(shape=(32, 64), seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("text", ["2:4", "1:4", "3:8", "4:8"])
def test_nm_keeps_the_n_largest_of_every_m(text):
    sp = Sparsity.parse(text)
    w = _w()
    res = compute_mask(w, sp)
    assert check_nm(res.mask, sp.n, sp.m)
    groups = res.mask.reshape(32, -1, sp.m)
    assert groups.sum(-1).eq(sp.n).all()
    mag = w.abs().reshape(32, -1, sp.m)
    kept_min = torch.where(groups, mag, torch.inf).amin(-1)
    pruned_max = torch.where(~groups, mag, -torch.inf).amax(-1)
    assert (kept_min >= pruned_max).all()
    assert torch.equal(res.weight, w * res.mask)


def test_unstructured_ratio_is_exact_per_row():
    res = compute_mask(_w(), Sparsity.parse("unstructured@25"))
    assert res.mask.sum(1).eq(48).all()
    keep_global = select_keep(_w().abs(), Sparsity.parse("unstructured@25"), per_row=False)
    assert keep_global.sum() == 32 * 48 and not keep_global.sum(1).eq(48).all()


@pytest.mark.parametrize("block", [16, 32])
def test_block_masks_are_block_constant_with_the_ratio(block):
    w = _w((64, 128))
    res = compute_mask(w, Sparsity.parse(f"block{block}@50"))
    assert check_block(res.mask, block)
    assert res.mask.float().mean().item() == 0.5
    tiles = w.abs().reshape(64 // block, block, 128 // block, block).sum((1, 3))
    kept = res.mask[::block, ::block]
    # Balanced per row of tiles: each keeps half its tiles, the largest ones of that row,
    # so no output row-block is ever pruned away entirely.
    assert (kept.sum(1) == (128 // block) // 2).all()
    for row in range(kept.shape[0]):
        assert tiles[row][kept[row]].min() >= tiles[row][~kept[row]].max()


def test_channel_prunes_whole_input_columns():
    res = compute_mask(_w(), Sparsity.parse("channel@25"))
    cols = res.mask.all(0)
    assert cols.sum() == 48 and torch.equal(res.mask, cols.expand_as(res.mask))


def test_dense_keeps_everything():
    w = _w()
    res = compute_mask(w, Sparsity())
    assert res.mask.all() and torch.equal(res.weight, w) and res.density == 1.0


def test_checks_reject_wrong_masks():
    ok = torch.tensor([[1, 1, 0, 0, 0, 1, 0, 1]], dtype=torch.bool)
    assert check_nm(ok, 2, 4)
    assert not check_nm(torch.tensor([[1, 1, 1, 0]], dtype=torch.bool), 2, 4)
    assert not check_nm(torch.ones(1, 6, dtype=torch.bool), 2, 4)
    m = torch.ones(32, 32, dtype=torch.bool)
    assert check_block(m, 16)
    m[0, 0] = False
    assert not check_block(m, 16) and not check_block(torch.ones(20, 32, dtype=torch.bool), 16)


def test_shapes_that_do_not_tile_are_user_errors():
    with pytest.raises(UserInputError, match="divisible by 4"):
        compute_mask(_w((8, 30)), Sparsity.parse("2:4"))
    with pytest.raises(UserInputError, match="divisible by 32"):
        compute_mask(_w((48, 64)), Sparsity.parse("block32@50"))
    with pytest.raises(UserInputError, match="2-D"):
        compute_mask(torch.ones(4), Sparsity.parse("2:4"))
