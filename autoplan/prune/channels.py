"""Structured MLP channel pruning: drop whole intermediate channels of a gated MLP.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from autoplan.errors import UserInputError


@dataclass(frozen=True)
class ChannelPruneResult:
    """Kept intermediate channels and the shrunk MLP weights.

    Attributes:
        kept: sorted int64 indices of the kept intermediate channels.
        gate: gate_proj weight [kept, hidden].
        up: up_proj weight [kept, hidden].
        down: down_proj weight [hidden, kept].
        mask: bool [intermediate], True = kept.
    """

    kept: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    mask: Tensor


def _check_shapes(gate: Tensor, up: Tensor, down: Tensor) -> int:
    if gate.ndim != 2 or gate.shape != up.shape or down.shape != (gate.shape[1], gate.shape[0]):
        raise UserInputError(
            "prune_mlp_channels needs gate and up as [intermediate, hidden] and down as "
            f"[hidden, intermediate]; got {tuple(gate.shape)}, {tuple(up.shape)}, {tuple(down.shape)}"
        )
    return gate.shape[0]


def prune_mlp_channels(
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    ratio: float,
    *,
    act_norm: Tensor | None = None,
    multiple_of: int = 1,
) -> ChannelPruneResult:
    """Remove ``ratio`` of a gated MLP's intermediate channels, consistently in all three weights.

    Args:
        gate: gate_proj weight [intermediate, hidden].
        up: up_proj weight [intermediate, hidden].
        down: down_proj weight [hidden, intermediate].
        ratio: fraction of channels to remove, in [0, 1).
        act_norm: optional [intermediate] L2 norms of down_proj's input channels.
        multiple_of: round the kept count up to a multiple of this (kernel tile friendliness).

    Returns:
        The ChannelPruneResult.

    Raises:
        UserInputError: shapes that do not form an MLP, or a ratio outside [0, 1).
    """
    inter = _check_shapes(gate, up, down)
    if not 0 <= ratio < 1:
        raise UserInputError(f"channel pruning ratio must be in [0, 1), got {ratio}")
    if multiple_of < 1:
        raise UserInputError(f"multiple_of must be a positive integer, got {multiple_of}")
    n_keep = inter - round(inter * ratio)
    n_keep = min(inter, -(-max(n_keep, 1) // multiple_of) * multiple_of)
    down_norm = down.detach().float().norm(dim=0)
    if act_norm is not None:
        if act_norm.shape != (inter,):
            raise UserInputError(
                f"act_norm must have one entry per intermediate channel ({inter}), "
                f"got shape {tuple(act_norm.shape)}"
            )
        h_norm = act_norm.detach().float()
    else:
        h_norm = gate.detach().float().norm(dim=1) * up.detach().float().norm(dim=1)
    score = down_norm * h_norm
    kept = torch.topk(score, n_keep).indices.sort().values
    mask = torch.zeros(inter, dtype=torch.bool)
    mask[kept] = True
    return ChannelPruneResult(
        kept=kept,
        gate=gate[kept].clone(),
        up=up[kept].clone(),
        down=down[:, kept].clone(),
        mask=mask,
    )


__all__ = ["ChannelPruneResult", "prune_mlp_channels"]
