"""Validate the cost model against published speedups (autoplan/data/measurements.toml).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from autoplan.cost.configs import resolve_config
from autoplan.cost.efficiency import (baseline_precision, family_efficiency, family_of,
                                      replaced_family, transfer_row)
from autoplan.cost.linear import call_overhead, gemm_time
from autoplan.cost.model import PREFILL_CHUNK, CostModel
from autoplan.cost.report import Memory
from autoplan.cost.trtllm_bench import BenchSettings, bench_settings
from autoplan.errors import AutoplanError
from autoplan.formats import Choice
from autoplan.targets import get_target
from autoplan.workload import Workload

_HIGHER_IS_BETTER = {"throughput", "decode_tokens_per_s"}
_LOWER_IS_BETTER = {"ttft": "ttft_s", "latency": "request_latency_s"}
_SIDE_KEYS = ("model", "batch", "input_len", "output_len", "kv_bytes", "max_batch",
              "kv_pool_fraction", "kv_free_fraction")


@dataclass(frozen=True)
class PointResult:
    """One validation point: predicted vs published speedup."""

    id: str
    source: str
    metric: str
    published: float
    predicted: float | None
    detail: str  # batch sizes used, or why the point was skipped
    tuned: bool = True  # in view when the constants were set (in sample)
    families: tuple[str, ...] = ()  # efficiency rows the point's targets use
    lofo: dict[str, float] = field(default_factory=dict)  # family held out -> predicted
    moe: bool = False  # a side runs a mixture-of-experts model

    @property
    def error(self) -> float | None:
        """Signed relative error of the predicted ratio."""
        if self.predicted is None:
            return None
        return (self.predicted - self.published) / self.published

    def lofo_errors(self) -> dict[str, float]:
        """Signed relative error with each family's constants held out."""
        return {f: (v - self.published) / self.published for f, v in self.lofo.items()}


def _mape(errors: list[float]) -> float:
    return sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


@dataclass(frozen=True)
class ValidationReport:
    """Every point and the MAPE over the evaluated ones."""

    points: tuple[PointResult, ...]

    @property
    def mape(self) -> float:
        """Over every evaluated point."""
        return _mape([p.error for p in self.points if p.error is not None])

    @property
    def mape_in_sample(self) -> float:
        return _mape([p.error for p in self.points if p.error is not None and p.tuned])

    @property
    def mape_out_of_sample(self) -> float:
        return _mape([p.error for p in self.points if p.error is not None and not p.tuned])

    def lofo_by_family(self) -> dict[str, float]:
        """Leave-one-family-out MAPE of the in-sample points, per family held out."""
        by: dict[str, list[float]] = {}
        for p in self.points:
            if p.tuned:
                for f, e in p.lofo_errors().items():
                    by.setdefault(f, []).append(e)
        return {f: _mape(v) for f, v in sorted(by.items())}

    def mape_by_source(self) -> dict[str, float]:
        """MAPE of the evaluated points of each source (one table can hold many points)."""
        by: dict[str, list[float]] = {}
        for p in self.points:
            if p.error is not None:
                by.setdefault(p.source, []).append(p.error)
        return {s: _mape(v) for s, v in sorted(by.items())}

    @property
    def mape_moe(self) -> float:
        """Over the evaluated points that run a mixture-of-experts model (all out of sample)."""
        return _mape([p.error for p in self.points if p.error is not None and p.moe])

    @property
    def mape_lofo(self) -> float:
        """Over every (in-sample point, family it involves) pair."""
        return _mape([e for p in self.points if p.tuned for e in p.lofo_errors().values()])

    def to_json(self) -> dict[str, Any]:
        return {
            "mape": self.mape, "mape_in_sample": self.mape_in_sample,
            "mape_out_of_sample": self.mape_out_of_sample, "mape_lofo": self.mape_lofo,
            "lofo_by_family": self.lofo_by_family(), "mape_by_source": self.mape_by_source(),
            "evaluated": sum(p.predicted is not None for p in self.points),
            "in_sample": sum(p.predicted is not None and p.tuned for p in self.points),
            "out_of_sample": sum(p.predicted is not None and not p.tuned for p in self.points),
            "moe": sum(p.predicted is not None and p.moe for p in self.points),
            "mape_moe": self.mape_moe,
            "points": [asdict(p) | {"error": p.error} for p in self.points],
        }


@cache
def load_measurements() -> tuple[dict[str, Any], ...]:
    """The published points, as parsed TOML tables."""
    text = (resources.files("autoplan") / "data" / "measurements.toml").read_text()
    return tuple(tomllib.loads(text)["points"])


def _side(point: dict[str, Any], side: str) -> dict[str, Any]:
    merged = {k: point[k] for k in _SIDE_KEYS if k in point}
    return merged | point[side]


def kv_pool_fits(memory: Memory, device_bytes: float, pool_fraction: float | None) -> bool:
    """Whether a batch's KV cache fits the runtime's KV pool.

    pool_fraction None: vLLM's rule (the model's `Memory.fits`): weights + KV + workspace
    within gpu_memory_utilization (0.90) of the device. A fraction: TensorRT-LLM's rule
    (`kv_cache_free_gpu_mem_fraction`, default 0.90 [TRT-PO]): the KV pool is that share of
    the memory left free AFTER the weights and activations are loaded, so a runtime that
    keeps more memory free for the cache holds more sequences than vLLM's rule on the same
    device (H200, Llama-70B FP8 weights and KV, 128 + 2048 tokens: 171 instead of 151).
    """
    if pool_fraction is None:
        return memory.fits
    free = device_bytes - memory.weights_bytes - memory.workspace_bytes
    return memory.kv_cache_bytes <= pool_fraction * free


def _bench(model: str, side: dict[str, Any]) -> BenchSettings | None:
    """trtllm-bench's own settings for a side that carries TensorRT-LLM's KV rule
    (`kv_pool_fraction`: the perf-overview points, run with trtllm-bench throughput and no
    --max_batch_size/--max_num_tokens), else None."""
    pool_fraction = side.get("kv_pool_fraction")
    if pool_fraction is None:
        return None
    return bench_settings(resolve_config(model), get_target(side["target"]),
                          Choice.parse(side["choice"]), side.get("input_len", 512),
                          side.get("output_len", 128), side.get("kv_bytes", 2.0), pool_fraction)


def _prefill_chunk(side: dict[str, Any], bench: BenchSettings | None) -> int:
    """Prompt tokens per prefill step: trtllm-bench's whole prompts per max_num_tokens
    (chunked prefill off), else the model's default chunk."""
    if bench is None:
        return PREFILL_CHUNK
    return bench.prompts_per_step * side.get("input_len", 512)


def _max_batch(model: str, side: dict[str, Any]) -> int:
    """Largest batch (<= max_batch, and <= trtllm-bench's max_batch_size where it applies)
    whose KV cache fits the runtime's KV pool."""
    spec, target = resolve_config(model), get_target(side["target"])
    choice = Choice.parse(side["choice"])
    # LMDeploy's cache_max_entry_count is the same rule as TensorRT-LLM's pool (a share of
    # the memory free after the weights) without trtllm-bench's own settings
    pool_fraction = side.get("kv_pool_fraction", side.get("kv_free_fraction"))
    bench = _bench(model, side)
    chunk = _prefill_chunk(side, bench)

    def fits(batch: int) -> bool:
        wl = Workload(batch=batch, input_len=side.get("input_len", 512),
                      output_len=side.get("output_len", 128))
        cm = CostModel(spec, target, wl, kv_bytes=side.get("kv_bytes", 2.0),
                       prefill_chunk=chunk)
        return kv_pool_fits(cm.memory(cm.resolve(choice)), target.memory_bytes, pool_fraction)

    lo, hi = 0, int(side.get("max_batch", 256))
    if bench is not None:
        hi = min(hi, bench.max_batch_size)
    while lo < hi:  # invariant: lo fits (or is 0), hi+1 does not
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    if lo == 0:
        raise AutoplanError(f"{model} with {side['choice']} does not fit on {side['target']}")
    return lo


def _value(point: dict[str, Any], side_name: str) -> tuple[float, str]:
    side = _side(point, side_name)
    target, choice = get_target(side["target"]), Choice.parse(side["choice"])
    if point["metric"] == "gemm":
        eff = family_efficiency(target)
        m, n, k = point["m"], point["n"], point["k"]
        t = gemm_time(target, eff, choice, m, n, k, baseline_precision(target)).seconds
        return t + call_overhead(target, eff, choice), f"{m}x{n}x{k}"
    batch, model = side.get("batch", 1), side["model"]  # a side may name its own model
    if batch == "max":
        batch = _max_batch(model, side)
    wl = Workload(batch=batch, input_len=side.get("input_len", 512),
                  output_len=side.get("output_len", 128))
    cm = CostModel(resolve_config(model), target, wl, kv_bytes=side.get("kv_bytes", 2.0),
                   prefill_chunk=_prefill_chunk(side, _bench(model, side)))
    metrics = cm.evaluate(choice).metrics
    metric = point["metric"]
    if metric in _HIGHER_IS_BETTER:
        return getattr(metrics, metric), f"B={batch}"
    return getattr(metrics, _LOWER_IS_BETTER[metric]), f"B={batch}"


def _ratio(point: dict[str, Any]) -> tuple[float, str]:
    cand, cand_detail = _value(point, "candidate")
    ref, ref_detail = _value(point, "baseline")
    # times: speedup = baseline time / candidate time
    ratio = cand / ref if point["metric"] in _HIGHER_IS_BETTER else ref / cand
    return ratio, cand_detail if cand_detail == ref_detail else f"{cand_detail} vs {ref_detail}"


def _runs_moe(point: dict[str, Any]) -> bool:
    models = {_side(point, s).get("model") for s in ("candidate", "baseline")} - {None}
    try:
        return any(resolve_config(m).moe is not None for m in models)
    except AutoplanError:
        return False


def validate_point(point: dict[str, Any]) -> PointResult:
    """Predict one point's speedup ratio (and, for in-sample points, with each of its
    families' constants held out)."""
    base = dict(id=point["id"], source=point["source"], metric=point["metric"],
                published=float(point["published"]), tuned=bool(point.get("tuned", True)),
                moe=_runs_moe(point))
    try:
        families = tuple(dict.fromkeys(family_of(get_target(point[s]["target"]))
                                       for s in ("candidate", "baseline")))
        ratio, detail = _ratio(point)
    except AutoplanError as exc:
        return PointResult(**base, predicted=None, detail=f"skipped: {exc}")
    lofo = {}
    for family in families if base["tuned"] else ():
        row = transfer_row(family)
        if row is not None:
            with replaced_family(family, row):
                lofo[family] = _ratio(point)[0]
    return PointResult(**base, predicted=ratio, detail=detail, families=families, lofo=lofo)


def validate() -> ValidationReport:
    """Every published point, predicted."""
    return ValidationReport(tuple(validate_point(p) for p in load_measurements()))


@cache
def family_error(family: str, moe: bool = False) -> tuple[float, int, str]:
    """(mean |error| of the predicted speedup ratios, points, which points) for one efficiency
    family and model kind (dense, or mixture-of-experts with `moe`): the points whose every
    target is of that family; when none is, every point that involves it; when none does,
    every point of the kind. What a ratio the cost model predicts on such a target may be
    off by (the search's noise rule, search/preparation/_uncertainty.py). No leave-one-family-out
    predictions: a few seconds less than `validate`."""
    points = [p for p in load_measurements() if _runs_moe(p) == moe]
    fams = []
    for p in points:
        try:
            fams.append(tuple(family_of(get_target(p[s]["target"]))
                              for s in ("candidate", "baseline")))
        except AutoplanError:
            fams.append(())
    kind = "mixture-of-experts" if moe else "dense"
    alone = [p for p, f in zip(points, fams, strict=True) if f and set(f) == {family}]
    involving = [p for p, f in zip(points, fams, strict=True) if family in f]
    chosen, which = ((alone, f"of {kind} models on {family} targets alone") if alone else
                     (involving, f"of {kind} models involving a {family} target")
                     if involving else (points, f"of {kind} models, every family"))
    errors = [e for p in chosen if (e := validate_point_fast(p)) is not None]
    return _mape(errors), len(errors), which


def validate_point_fast(point: dict[str, Any]) -> float | None:
    """One point's signed relative error (None: skipped), without the held-out families."""
    try:
        predicted, _ = _ratio(point)
    except AutoplanError:
        return None
    published = float(point["published"])
    return (predicted - published) / published


__all__ = ["PointResult", "ValidationReport", "family_error", "kv_pool_fits",
           "load_measurements", "validate", "validate_point", "validate_point_fast"]
