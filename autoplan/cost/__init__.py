"""Cost model: predicted prefill/decode times, throughput, latency, memory, energy and $ of
a model on a hardware target for a workload, per linear layer and additive over layers.

Public face: CostModel (model.py), Estimate/Metrics/Objective (report.py), resolve_config
(configs.py); efficiency constants per hardware family live in efficiency.py.
"""

from autoplan.cost.configs import bundled_configs, resolve_config
from autoplan.cost.efficiency import FamilyEfficiency, baseline_precision, family_efficiency
from autoplan.cost.fixed import PhaseTime
from autoplan.cost.measured import MeasuredTable
from autoplan.cost.model import CostModel, Decisions
from autoplan.cost.report import (
    DIRECTION,
    Estimate,
    LayerBreakdown,
    Memory,
    Metrics,
    Objective,
    metric_from_times,
    metrics_from_times,
    usd_per_million_tokens,
)
from autoplan.cost.sparse import sparse24_speedup

__all__ = [
    "CostModel", "DIRECTION", "Decisions", "Estimate", "FamilyEfficiency", "LayerBreakdown",
    "MeasuredTable", "Memory", "Metrics", "Objective", "PhaseTime", "baseline_precision",
    "bundled_configs", "family_efficiency", "metric_from_times", "metrics_from_times",
    "resolve_config", "sparse24_speedup", "usd_per_million_tokens",
]
