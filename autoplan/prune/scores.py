"""PruneScore: how a weight's importance is scored (the vocabulary, defined once; no torch,
so the CLI reads it without importing the pruning code)."""

from __future__ import annotations

from autoplan.textenum import TextEnum


class PruneScore(TextEnum):
    """How a weight's importance is scored before a sparsity pattern is applied."""

    __noun__ = "pruning score"

    MAGNITUDE = "magnitude"  # |W|
    WANDA = "wanda"  # |W| * ||X_j||_2 (needs activation norms)
    SPARSEGPT = "sparsegpt"  # OBS saliency with weight reconstruction (needs the Hessian)


__all__ = ["PruneScore"]
