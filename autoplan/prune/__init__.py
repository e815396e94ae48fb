"""Pruning: importance scores (magnitude, Wanda, SparseGPT) and sparsity patterns.

Public API: ``compute_mask`` -> ``PruneResult``; ``prune_mlp_channels`` ->
``ChannelPruneResult``; mask checks ``check_nm`` and ``check_block``.
"""

from autoplan.prune.channels import ChannelPruneResult, prune_mlp_channels
from autoplan.prune.masks import PruneResult, PruneScore, compute_mask, wanda_score
from autoplan.prune.patterns import check_block, check_nm, select_keep, validate_shape
from autoplan.prune.sparsegpt import sparsegpt_prune

__all__ = [
    "ChannelPruneResult",
    "PruneResult",
    "PruneScore",
    "check_block",
    "check_nm",
    "compute_mask",
    "prune_mlp_channels",
    "select_keep",
    "sparsegpt_prune",
    "validate_shape",
    "wanda_score",
]
