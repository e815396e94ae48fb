"""Measuring candidates on the real model under the quality budgets.

    QualityBudget.parse(text)                            `kl<=0.05`, `ppl<=+2%`, gates, slices
    Verifier(model, space, tables, evaluator: Evaluator, budget, ...).measure_many(picks)
        -> [Measurement]                                 through the evaluator (in memory or
                                                         streamed: autoplan.streaming)
    measurement_store(...) -> MeasurementStore           measurements kept on disk across runs
    Verifier.calibration(prior) -> Calibration           the surrogate scaled per format family
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py), so reading a budget
# does not import torch
_EXPORTS = {
    "SLICE_NAMES": "autoplan.search.verify._budget",
    "QualityBudget": "autoplan.search.verify._budget",
    "build_gates": "autoplan.search.verify._budget",
    "parse_budgets": "autoplan.search.verify._budget",
    "Calibration": "autoplan.search.verify._calibration",
    "Observation": "autoplan.search.verify._calibration",
    "family_shares": "autoplan.search.verify._calibration",
    "fit_calibration": "autoplan.search.verify._calibration",
    "format_family": "autoplan.search.verify._calibration",
    "scaled_tables": "autoplan.search.verify._calibration",
    "CACHE_VERSION": "autoplan.search.verify._measurement_cache",
    "MeasurementStore": "autoplan.search.verify._measurement_cache",
    "measurement_store": "autoplan.search.verify._measurement_cache",
    "KvSimulation": "autoplan.search.verify._verifier",
    "Measurement": "autoplan.search.verify._verifier",
    "RecoveredCandidate": "autoplan.search.verify._verifier",
    "RecoveryHook": "autoplan.search.verify._verifier",
    "SharedMeasurements": "autoplan.search.verify._verifier",
    "Verifier": "autoplan.search.verify._verifier",
    "decisions_key": "autoplan.search.verify._verifier",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

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
