"""GPTQ (Frantar et al., 2023): quantize column by column, pushing each column's rounding
error onto the columns not yet quantized through the inverse Hessian.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from autoplan.calib_stats import inverse_hessian_cholesky, prepare_hessian
from autoplan.formats.schemes import QParams, Scheme


def gptq_quantize(
    w: Tensor,
    hessian: Tensor,
    scheme: Scheme,
    *,
    mask: Tensor | None = None,
    blocksize: int = 128,
    damp: float = 0.01,
) -> tuple[Tensor, Tensor, QParams | None, Tensor | None]:
    """Run GPTQ on ``w`` [out, in] with ``hessian`` [in, in] (``2 X^T X / n``).

    Args:
        w: weight matrix.
        hessian: layer-input Hessian.
        scheme: the number format's scheme (see ``weight_scheme``).
        mask: optional keep-mask (True = kept) of ``w``'s shape.
        blocksize: columns per lazy-batch update (rounded to a multiple of the group).
        damp: dampening as a fraction of the mean Hessian diagonal.

    Returns:
        ``(dequant, code values, stored QParams, tensor ctx)``: float32 [out, in] twice, the
        parameters as ``quantize_rows`` shapes them, and the scheme's tensor-level ones.
    """
    h, dead = prepare_hessian(hessian, w)
    n = w.shape[1]
    g = scheme.group
    pad = (-n) % g if g else 0
    W = w.detach().float().clone()
    keep = None if mask is None else mask.to(torch.bool)
    if pad:  # padded inputs are dead: zero weight, unit Hessian diagonal, never kept
        W = torch.nn.functional.pad(W, (0, pad))
        h = torch.nn.functional.pad(h, (0, pad, 0, pad))
        idx = torch.arange(n, n + pad, device=h.device)
        h[idx, idx] = 1.0
        dead = torch.nn.functional.pad(dead, (0, pad), value=True)
        if keep is not None:
            keep = torch.nn.functional.pad(keep, (0, pad), value=False)
    W[:, dead] = 0.0
    # Tensor- and row-level scales see only kept weights; the pruned ones are still in W so
    # that their removal error is compensated column by column.
    kept_w = W if keep is None else W * keep
    ctx = scheme.prepare(kept_w)
    hinv = inverse_hessian_cholesky(h, damp)

    n_pad = n + pad
    deq = torch.zeros_like(W)
    codes = torch.zeros_like(W)
    row_params = None if g else scheme.qparams(kept_w, ctx)  # per channel: fixed up front
    group_params: list[QParams] = []
    bs = max(g, blocksize - blocksize % g) if g else blocksize
    for i1 in range(0, n_pad, bs):
        i2 = min(i1 + bs, n_pad)
        W1 = W[:, i1:i2].clone()
        err1 = torch.zeros_like(W1)
        hinv1 = hinv[i1:i2, i1:i2]
        keep1 = None if keep is None else keep[:, i1:i2]
        params = row_params
        for i in range(i2 - i1):
            if g and i % g == 0:
                slab = W1[:, i : i + g]
                if keep1 is not None:
                    slab = slab * keep1[:, i : i + g]
                params = scheme.qparams(slab, ctx)
                group_params.append(params)  # type: ignore[arg-type]
            col = W1[:, i : i + 1]
            target = col if keep1 is None else col * keep1[:, i : i + 1]
            q, c = scheme.fake(target, params, ctx)
            deq[:, i1 + i : i1 + i + 1] = q
            codes[:, i1 + i : i1 + i + 1] = c
            err = (col - q) / hinv1[i, i]
            W1[:, i:] -= err * hinv1[i : i + 1, i:]
            err1[:, i : i + 1] = err
        W[:, i2:] -= err1 @ hinv[i1:i2, i2:]

    stored = QParams.cat(group_params, dim=1) if g else row_params
    return deq[:, :n], codes[:, :n], stored, ctx


__all__ = ["gptq_quantize"]
