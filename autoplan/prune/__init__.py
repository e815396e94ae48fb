"""Pruning: importance scores (magnitude, Wanda, SparseGPT) and sparsity patterns.

Public API: ``compute_mask`` -> ``PruneResult``; ``prune_mlp_channels`` ->
``ChannelPruneResult``; mask checks ``check_nm`` and ``check_block``.
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py)
_EXPORTS = {
    "ChannelPruneResult": "autoplan.prune.channels",
    "prune_mlp_channels": "autoplan.prune.channels",
    "PruneResult": "autoplan.prune.masks",
    "PruneScore": "autoplan.prune.scores",
    "compute_mask": "autoplan.prune.masks",
    "wanda_score": "autoplan.prune.masks",
    "check_block": "autoplan.prune.patterns",
    "check_nm": "autoplan.prune.patterns",
    "select_keep": "autoplan.prune.patterns",
    "validate_shape": "autoplan.prune.patterns",
    "sparsegpt_prune": "autoplan.prune.sparsegpt",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

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
