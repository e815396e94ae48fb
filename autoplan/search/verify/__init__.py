"""Measuring candidates on the real model under the quality budgets.

    QualityBudget.parse(text)                            `kl<=0.05`, `ppl<=+2%`, gates, slices
    Verifier(model, space, tables, evaluator, budget, ...).measure_many(picks) -> [Measurement]
    measurement_store(...) -> MeasurementStore           measurements kept on disk across runs
"""

from __future__ import annotations

from autoplan.search.verify._budget import SLICE_NAMES, QualityBudget, build_gates, parse_budgets
from autoplan.search.verify._measurement_cache import (
    CACHE_VERSION,
    MeasurementStore,
    measurement_store,
)
from autoplan.search.verify._verifier import (
    CandidateContext,
    CandidateTask,
    Measurement,
    SharedMeasurements,
    Verifier,
    decisions_key,
    evaluate_candidate,
)

__all__ = [
    "CACHE_VERSION",
    "CandidateContext",
    "CandidateTask",
    "Measurement",
    "MeasurementStore",
    "QualityBudget",
    "SLICE_NAMES",
    "SharedMeasurements",
    "Verifier",
    "build_gates",
    "decisions_key",
    "evaluate_candidate",
    "measurement_store",
    "parse_budgets",
]
