"""Bench: real generation on this machine, baseline and plan side by side in one run.

Public API:
    read_plan(path) -> PlanInput                      decisions of a full or minimal plan
    check_cpu_plan(plan), apply_plan_cpu(loaded, plan, out_dir) -> CpuArtifact
    export_baseline(loaded, out_dir) -> CpuArtifact   dense fp32 in the same runtime
    ort_side / torch_side / run_bench(...) -> BenchReport
"""

from autoplan.bench.artifacts import apply_plan_cpu, check_cpu_plan, export_baseline
from autoplan.bench.planfile import PlanInput, read_plan
from autoplan.bench.report import BenchReport, SideStats
from autoplan.bench.runner import Side, ort_side, run_bench, torch_side
from autoplan.bench.system import peak_rss_bytes, read_bandwidth

__all__ = [
    "BenchReport", "PlanInput", "Side", "SideStats", "apply_plan_cpu", "check_cpu_plan",
    "export_baseline", "ort_side", "peak_rss_bytes", "read_bandwidth", "read_plan", "run_bench",
    "torch_side",
]
