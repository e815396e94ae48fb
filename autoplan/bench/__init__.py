"""Bench: real generation on this machine, baseline and plan side by side in one run.

Bench only measures: the artifacts it times come from ``autoplan.export`` (``apply_plan``,
``export_baseline``), plans are read by ``autoplan.plan.read_plan``, and the cost model's
prediction beside the measurement is the CPU backend's (``autoplan.backends.cpu.predict``).

Public API:
    ort_side / torch_side / run_bench(...) -> BenchReport; shared_weights (memory sharing)
"""

from autoplan.bench.report import BenchReport, SideStats
from autoplan.bench.runner import Side, ort_side, run_bench, shared_weights, torch_side
from autoplan.bench.system import peak_rss_bytes, read_bandwidth

__all__ = [
    "BenchReport", "Side", "SideStats", "ort_side", "peak_rss_bytes", "read_bandwidth",
    "run_bench", "shared_weights", "torch_side",
]
