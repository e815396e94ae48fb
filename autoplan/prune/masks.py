"""compute_mask: score a weight (magnitude, Wanda or SparseGPT) and apply a sparsity pattern."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from autoplan.errors import UserInputError
from autoplan.formats import Sparsity
from autoplan.prune.patterns import select_keep, validate_shape
from autoplan.prune.sparsegpt import sparsegpt_prune
from autoplan.prune.scores import PruneScore


@dataclass(frozen=True)
class PruneResult:
    """A pruning decision.

    Attributes:
        mask: bool tensor of the weight's shape, True = kept.
        weight: the pruned weight in the input dtype (zeros where the mask is False); for
            SparseGPT the kept weights are also updated to reconstruct the layer output.
    """

    mask: Tensor
    weight: Tensor

    @property
    def density(self) -> float:
        """Fraction of weights kept."""
        return float(self.mask.float().mean())


def wanda_score(w: Tensor, act_norm: Tensor) -> Tensor:
    """Wanda importance ``|W_ij| * ||X_j||_2`` for ``act_norm`` [in] (per input channel)."""
    if act_norm.ndim != 1 or act_norm.shape[0] != w.shape[1]:
        raise UserInputError(
            f"Wanda needs one activation norm per input channel ({w.shape[1]}), "
            f"got shape {tuple(act_norm.shape)}"
        )
    return w.detach().float().abs() * act_norm.detach().float()[None, :]


def compute_mask(
    w: Tensor,
    sparsity: Sparsity,
    *,
    score: PruneScore | str = PruneScore.MAGNITUDE,
    act_norm: Tensor | None = None,
    hessian: Tensor | None = None,
    blocksize: int = 128,
    damp: float = 0.01,
) -> PruneResult:
    """Choose which weights of ``w`` [out, in] to keep under ``sparsity``.

    Unstructured masks are per output row for magnitude and Wanda (as Wanda does) and per
    128-column block for SparseGPT (as SparseGPT does); ``channel@r`` on a single matrix
    removes whole input columns (use ``prune_mlp_channels`` to shrink an MLP consistently).

    Args:
        w: weight matrix.
        sparsity: the pattern (dense returns an all-True mask).
        score: "magnitude" (|W|), "wanda" (needs ``act_norm``) or "sparsegpt" (needs
            ``hessian``; also reconstructs the kept weights).
        act_norm: [in] L2 norm of each input channel over the calibration tokens.
        hessian: [in, in] Hessian ``2 X^T X / n`` of the layer inputs.
        blocksize: SparseGPT lazy-batch width.
        damp: SparseGPT dampening.

    Returns:
        The PruneResult.

    Raises:
        UserInputError: unknown score, missing statistics, or a shape the pattern cannot tile.
    """
    score = PruneScore.parse(score)
    validate_shape(tuple(w.shape), sparsity)
    if score is PruneScore.SPARSEGPT:
        if hessian is None:
            raise UserInputError(
                "score='sparsegpt' needs the layer Hessian: pass hessian=2*X.T@X/n"
            )
        keep, rebuilt = sparsegpt_prune(w, hessian, sparsity, blocksize=blocksize, damp=damp)
        return PruneResult(mask=keep, weight=rebuilt.to(w.dtype))
    if score is PruneScore.WANDA:
        if act_norm is None:
            raise UserInputError("score='wanda' needs act_norm: the L2 norm of each input channel")
        importance = wanda_score(w, act_norm)
    else:
        importance = w.detach().float().abs()
    keep = select_keep(importance, sparsity)
    return PruneResult(mask=keep, weight=torch.where(keep, w.detach(), torch.zeros_like(w)))


__all__ = ["PruneResult", "PruneScore", "compute_mask", "wanda_score"]
