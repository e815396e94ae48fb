"""Verification: apply candidate decisions to the real model and measure the budget metric.

Every measurement is memoized by picks, counted, and kept with its surrogate prediction, so
the calibration between surrogate and measured badness can be re-fitted from all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from autoplan.compress import CompressionSettings, audit_digests, collect_stats, compressed_copy
from autoplan.formats import Choice
from autoplan.quality.evaluator import QualityEvaluator, QualityResult
from autoplan.search.budget import QualityBudget
from autoplan.search.space import SearchSpace
from autoplan.search.tables import Tables
from autoplan.streaming.evaluate import StreamedEvaluator


@dataclass(frozen=True)
class Measurement:
    picks: tuple[int, ...]
    label: str
    quality: QualityResult
    surrogate: float
    badness: float
    passed: bool
    audit: dict[str, dict[str, str]]


@dataclass
class Verifier:
    model: torch.nn.Module
    space: SearchSpace
    tables: Tables
    evaluator: QualityEvaluator | StreamedEvaluator
    budget: QualityBudget
    settings: CompressionSettings
    calib_batches: Sequence[torch.Tensor]
    measured: dict[tuple[int, ...], Measurement] = field(default_factory=dict)
    _stats: dict | None = None

    @property
    def count(self) -> int:
        return len(self.measured)

    def decisions(self, picks: Sequence[int]) -> dict[str, Choice]:
        return self.space.decisions(self.tables.choices_of(picks))

    def _calibration_stats(self) -> dict:
        if self._stats is None:
            names = [la.name for u in self.space.units for la in u.layers]
            self._stats = collect_stats(self.model, names, self.calib_batches)
        return self._stats

    def measure(self, picks: Sequence[int], label: str) -> Measurement:
        key = tuple(picks)
        if key in self.measured:
            return self.measured[key]
        decisions = self.decisions(key)
        # Calibration statistics are needed only for Wanda/SparseGPT masks and GPTQ.
        needs = self.settings.quant_method == "gptq" or any(
            c.sparsity.kind != "dense" and c != self.space.baseline for c in decisions.values())
        quality, audit = self._evaluate(decisions, needs)
        badness = self.budget.badness(quality)
        m = Measurement(key, label, quality, self.tables.surrogate(key), badness,
                        badness <= self.budget.limit, audit)
        self.measured[key] = m
        return m

    def _evaluate(self, decisions: dict[str, Choice], needs_stats: bool
                  ) -> tuple[QualityResult, dict[str, dict[str, str]]]:
        if isinstance(self.evaluator, StreamedEvaluator):
            # Streamed: compressed block by block on the fly, Hessians per resident block.
            return self.evaluator.evaluate_decisions(decisions, self.settings,
                                                     baseline=self.space.baseline,
                                                     needs_stats=needs_stats)
        stats = self._calibration_stats() if needs_stats else None
        compressed, swapped = compressed_copy(self.model, decisions, stats, self.settings,
                                              baseline=self.space.baseline)
        with torch.no_grad():
            quality = self.evaluator.evaluate(compressed)
        del compressed
        return quality, audit_digests(swapped)

    def slope(self, prior: float) -> float:
        """Measured badness per surrogate nat: the largest ratio seen (conservative)."""
        ratios = [m.badness / m.surrogate for m in self.measured.values() if m.surrogate > 1e-12]
        return max(ratios) if ratios else prior


__all__ = ["Measurement", "Verifier"]
