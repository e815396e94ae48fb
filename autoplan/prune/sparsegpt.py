"""SparseGPT (Frantar & Alistarh, 2023): one-shot pruning with OBS weight reconstruction.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from autoplan.formats import Sparsity
from autoplan.prune.patterns import select_keep, validate_shape
from autoplan.calib_stats import inverse_hessian_cholesky, prepare_hessian


def _block_width(blocksize: int, sparsity: Sparsity) -> int:
    # Column blocks must hold whole N:M groups and whole B x B tiles.
    unit = (
        sparsity.m if sparsity.kind == "nm" else sparsity.block if sparsity.kind == "block" else 1
    )
    return max(unit, blocksize - blocksize % unit)


def sparsegpt_prune(
    w: Tensor, hessian: Tensor, sparsity: Sparsity, *, blocksize: int = 128, damp: float = 0.01
) -> tuple[Tensor, Tensor]:
    """Prune ``w`` [out, in] to ``sparsity`` with SparseGPT.

    Args:
        w: weight matrix.
        hessian: [in, in] Hessian ``2 X^T X / n`` of the layer inputs.
        sparsity: the pattern.
        blocksize: columns per lazy-batch update.
        damp: dampening as a fraction of the mean Hessian diagonal.

    Returns:
        ``(keep mask, reconstructed float32 weight)``; pruned entries are exactly zero.
    """
    validate_shape(tuple(w.shape), sparsity)
    if sparsity.kind == "dense":
        return torch.ones_like(w, dtype=torch.bool), w.detach().float().clone()
    h, dead = prepare_hessian(hessian, w)
    W = w.detach().float().clone()
    W[:, dead] = 0.0
    hinv = inverse_hessian_cholesky(h, damp)
    n = W.shape[1]
    keep = torch.ones_like(W, dtype=torch.bool)
    bs = _block_width(blocksize, sparsity)
    m = sparsity.m
    for i1 in range(0, n, bs):
        i2 = min(i1 + bs, n)
        W1 = W[:, i1:i2].clone()
        err1 = torch.zeros_like(W1)
        hinv1 = hinv[i1:i2, i1:i2]
        d = hinv1.diagonal()
        if sparsity.kind != "nm":
            keep1 = select_keep(W1**2 / d**2, sparsity, per_row=False)
        else:
            keep1 = torch.ones_like(W1, dtype=torch.bool)
        for i in range(i2 - i1):
            if sparsity.kind == "nm" and i % m == 0:
                sal = W1[:, i : i + m] ** 2 / d[i : i + m] ** 2
                keep1[:, i : i + m] = select_keep(sal, sparsity)
            col = W1[:, i : i + 1]
            q = col * keep1[:, i : i + 1]
            err = (col - q) / d[i]
            W1[:, i:] -= err * hinv1[i : i + 1, i:]
            W1[:, i : i + 1] = q
            err1[:, i : i + 1] = err
        W[:, i1:i2] = W1
        W[:, i2:] -= err1 @ hinv[i1:i2, i2:]
        keep[:, i1:i2] = keep1
    W = torch.where(keep, W, torch.zeros_like(W))
    return keep, W


__all__ = ["sparsegpt_prune"]
