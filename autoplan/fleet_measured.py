"""Fleet sizing from a measured capacity curve instead of the analytic queue.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.errors import UserInputError
from autoplan.fleet import HOURS_PER_MONTH, FleetSizing, Step
from autoplan.targets import Target

# achieved / offered request rate below which the node fell behind: a short benchmark's
# achieved rate runs ~10 % under the offered one even when it keeps up (its last requests'
# service time counts in the duration; 16-32 Poisson arrivals vary by ~20 %)
SUSTAINED = 0.8


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured request rate of one server (seconds, requests/s)."""

    rate: float  # offered (Poisson) request rate; inf: every request at once
    throughput: float  # achieved requests/s
    p99_latency_s: float
    latency_source: str  # "e2el p99" or "TTFT p99 + (out-1) x TPOT p99"
    ttft_p99_s: float
    tpot_p99_s: float


@dataclass(frozen=True)
class MeasuredCurves:
    """A serving result's capacity curves, one per side, and the workload they were measured
    under."""

    source: str  # which benchmark wrote it
    input_len: int
    output_len: int
    sides: dict[str, tuple[MeasuredPoint, ...]]
    engine: str = ""  # the runtime that served it: "vllm" or "llama.cpp"
    machine: dict[str, Any] | None = None  # the benchmark's record: cpu, cores, ...

    def side(self, name: str) -> tuple[MeasuredPoint, ...]:
        if name not in self.sides:
            raise UserInputError(f"the measured result has no side '{name}' (it has: "
                                 f"{', '.join(self.sides)}): pass --measured-sides BASE,PLAN")
        return self.sides[name]


@dataclass(frozen=True)
class MeasuredSizing:
    """size_fleet_measured's result, with every step of the arithmetic."""

    node_capacity_rps: float | None  # r*: None when no measured rate holds the SLA
    node_throughput_tok_s: float | None
    nodes: int | None
    p99_s: float | None  # measured at r*
    utilization: float | None  # qps / (nodes x r*)
    usd_per_month: float | None
    usd_per_million_tokens: float | None
    steps: tuple[Step, ...] = field(repr=False)
    reason: str = ""

    to_json = FleetSizing.to_json  # the fields, the steps as a list of dicts


def _point(doc: dict[str, Any], output_len: int) -> MeasuredPoint:
    rate = float(doc["request_rate"])
    ttft, tpot = float(doc["ttft_p99_ms"]) / 1e3, float(doc["tpot_p99_ms"]) / 1e3
    if doc.get("e2el_p99_ms") is not None:
        latency, source = float(doc["e2el_p99_ms"]) / 1e3, "e2el p99"
    else:
        latency, source = ttft + (output_len - 1) * tpot, "TTFT p99 + (out-1) x TPOT p99"
    return MeasuredPoint(rate, float(doc["request_throughput"]), latency, source, ttft, tpot)


def read_capacity_curves(path: str | Path) -> MeasuredCurves:
    """The capacity curves in a serving benchmark's result JSON.

    Reads benchmarks/serve_bench.py's result (``sides[NAME].points``, vLLM serving) and
    benchmarks/llamacpp_serve.py's (``serving[NAME].points``, llama.cpp serving); both keep
    the workload under ``workload.input_len`` / ``workload.output_len``.

    Raises:
        UserInputError: the file is missing, not JSON, or holds no capacity curve.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise UserInputError(f"cannot read the measured result '{path}': {exc.strerror}: "
                             "pass the JSON benchmarks/serve_bench.py or llamacpp_serve.py "
                             "wrote") from None
    except ValueError as exc:
        raise UserInputError(f"'{path}' is not JSON ({exc}): pass the JSON "
                             "benchmarks/serve_bench.py or llamacpp_serve.py wrote") from None
    sides = doc.get("sides") if isinstance(doc, dict) else None
    source, engine = "benchmarks/serve_bench.py (vLLM)", "vllm"
    if not (isinstance(sides, dict) and any(isinstance(s, dict) and "points" in s
                                            for s in sides.values())):
        sides, source, engine = (doc.get("serving") if isinstance(doc, dict) else None,
                                 "benchmarks/llamacpp_serve.py (llama.cpp)", "llama.cpp")
    if not isinstance(sides, dict) or not sides:
        raise UserInputError(f"'{path}' holds no capacity curve (no sides[*].points or "
                             "serving[*].points): pass a serving benchmark's result")
    try:
        work = doc["workload"]
        input_len, output_len = int(work["input_len"]), int(work["output_len"])
        curves = {name: tuple(_point(p, output_len) for p in side["points"])
                  for name, side in sides.items() if isinstance(side, dict) and side.get("points")}
    except (KeyError, TypeError, ValueError) as exc:
        raise UserInputError(f"'{path}' has a capacity curve without {exc}: is it a serving "
                             "benchmark's result?") from None
    if not curves:
        raise UserInputError(f"'{path}' has sides but no measured points")
    machine = doc.get("machine")
    return MeasuredCurves(source, input_len, output_len, curves, engine,
                          machine if isinstance(machine, dict) else None)


def this_machine() -> dict[str, Any]:
    """This machine as the benchmarks record it: the CPU model (/proc/cpuinfo) and the
    number of logical CPUs."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count()}


def _describe(machine: dict[str, Any]) -> str:
    return f"{machine.get('cpu', 'an unnamed CPU')}, {machine.get('cores', '?')} cores"


def check_curve_applies(curves: MeasuredCurves, node: Target, runtime: str) -> None:
    """Refuse a curve that does not measure what the fleet would run: another engine than
    the plan's runtime, or another machine than the node (a curve measured here sizes
    `--node local`; a catalog node only a curve whose recorded CPU names that part).

    Raises:
        UserInputError: one line naming both and the fix.
    """
    if curves.engine and curves.engine != runtime:
        raise UserInputError(
            f"the measured curve is {curves.engine}'s ({curves.source}) but the plan runs on "
            f"{runtime}: measure the plan served by {runtime}, or drop --measured for the "
            "analytic sizing")
    if curves.machine is None:
        raise UserInputError(
            "the measured result does not record the machine it was measured on: rerun its "
            "benchmark (it records `machine`), or drop --measured")
    fix = ("size --node local on the machine that measured it, or drop --measured for the "
           "analytic sizing")
    if node.measured:
        here = this_machine()
        if (str(curves.machine.get("cpu")), curves.machine.get("cores")) != (
                here["cpu"], here["cores"]):
            raise UserInputError(
                f"the curve was measured on another machine ({_describe(curves.machine)}) "
                f"than this one ({_describe(here)}): {fix}")
        return
    recorded = " ".join(str(curves.machine.get(k, "")) for k in ("cpu", "gpu")).lower()
    parts = [t for t in node.name.lower().replace("_", "-").split("-") if t]
    if not parts or not all(t in recorded for t in parts):
        raise UserInputError(
            f"a measured curve sizes the machine it was measured on "
            f"({_describe(curves.machine)}), not --node {node.name}: {fix}")


def size_fleet_measured(points: tuple[MeasuredPoint, ...] | list[MeasuredPoint], *, qps: float,
                        p99_s: float, output_len: int, price_per_hour: float,
                        sustained: float = SUSTAINED) -> MeasuredSizing:
    """Nodes for ``qps`` under a p99 request-latency SLA from one node's measured curve
    (docs/modules.md has the rule).

    Raises:
        UserInputError: qps or the SLA is not a finite positive number, or no points.
    """
    for name, value in (("qps", qps), ("p99", p99_s)):
        if not 0 < value < math.inf:
            raise UserInputError(f"fleet sizing needs a finite {name} > 0, got {value}")
    if not points:
        raise UserInputError("the measured curve has no points")
    steps: list[Step] = []

    def step(label: str, formula: str, value: float, unit: str = "") -> float:
        steps.append(Step(label, formula, value, unit))
        return value

    held = []
    for p in sorted(points, key=lambda p: p.rate):
        kept_up = math.isinf(p.rate) or p.throughput >= sustained * p.rate
        ok = kept_up and p.p99_latency_s <= p99_s
        verdict = "holds" if ok else ("fell behind" if not kept_up else "over the SLA")
        step(f"rate {p.rate:g} req/s", f"achieved {p.throughput:.4g} req/s, p99 {p.latency_source}"
             f" = {p.p99_latency_s:.4g} s: {verdict}", p.p99_latency_s, "s")
        if ok:
            # at rate inf the node's capacity is what it achieved, not the offered rate
            held.append((p.throughput if math.isinf(p.rate) else p.rate, p))
    if not held:
        return MeasuredSizing(None, None, None, None, None, None, None, tuple(steps),
                              reason=f"no measured rate holds p99 <= {p99_s:.3g} s: measure "
                              "lower rates, or the SLA is below one request's latency")
    capacity, best = max(held, key=lambda x: x[0])
    step("node capacity r*", "highest measured rate that holds", capacity, "req/s")
    tok = step("node throughput", f"{capacity:.4g} x {output_len}", capacity * output_len, "tok/s")
    nodes = int(step("nodes", f"ceil({qps:g} / {capacity:.4g})", math.ceil(qps / capacity - 1e-12)))
    util = step("utilization", f"{qps:g} / ({nodes} x {capacity:.4g})", qps / (nodes * capacity))
    month = step("$/month", f"{nodes} x ${price_per_hour}/h x {HOURS_PER_MONTH} h",
                 nodes * price_per_hour * HOURS_PER_MONTH, "$")
    per_m = step("$/1M tokens", f"{nodes} x ${price_per_hour}/h / ({qps:g} x {output_len} x "
                 "3600) x 1e6", nodes * price_per_hour / (qps * output_len * 3600) * 1e6, "$")
    return MeasuredSizing(capacity, tok, nodes, best.p99_latency_s, util, month, per_m,
                          tuple(steps))


__all__ = ["SUSTAINED", "MeasuredCurves", "MeasuredPoint", "MeasuredSizing",
           "check_curve_applies", "read_capacity_curves", "size_fleet_measured", "this_machine"]
