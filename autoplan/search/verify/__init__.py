"""Measuring candidates on the real model under the quality budgets.

    QualityBudget.parse(text)                            `kl<=0.05`, `ppl<=+2%`, gates, slices
    Verifier(model, space, tables, evaluator: Evaluator, budget, ...).measure_many(picks)
        -> [Measurement]                                 through the evaluator (in memory or
                                                         streamed: autoplan.streaming)
    measurement_store(...) -> MeasurementStore           measurements kept on disk across runs
    Verifier.calibration(prior) -> Calibration           the surrogate scaled per format family
"""

from __future__ import annotations

from autoplan.search.verify._budget import SLICE_NAMES, QualityBudget, build_gates, parse_budgets
from autoplan.search.verify._calibration import (
    Calibration,
    Observation,
    family_shares,
    fit_calibration,
    format_family,
    scaled_tables,
)
from autoplan.search.verify._measurement_cache import (
    CACHE_VERSION,
    MeasurementStore,
    measurement_store,
)
from autoplan.search.verify._verifier import (
    KvSimulation,
    Measurement,
    RecoveredCandidate,
    RecoveryHook,
    SharedMeasurements,
    Verifier,
    decisions_key,
)

__all__ = [
    "CACHE_VERSION",
    "Calibration",
    "KvSimulation",
    "Measurement",
    "MeasurementStore",
    "Observation",
    "QualityBudget",
    "SLICE_NAMES",
    "RecoveredCandidate",
    "RecoveryHook",
    "SharedMeasurements",
    "Verifier",
    "build_gates",
    "decisions_key",
    "family_shares",
    "fit_calibration",
    "format_family",
    "measurement_store",
    "parse_budgets",
    "scaled_tables",
]
