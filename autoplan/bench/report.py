"""Bench results: per-side statistics, ratios, and the JSON/table forms."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autoplan.backends.cpu.ort_runtime import GenerationResult

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class SideStats:
    """One configuration's measurements over all its batches (medians and percentiles)."""

    name: str
    runtime: str
    requests: int
    prefill_tok_s: float  # median over batches
    decode_tok_s: float  # median over batches (all sequences of a batch together)
    ttft_ms: dict[str, float]  # p50/p95/p99 over requests
    tpot_ms: dict[str, float]
    rss_load_mb: float  # resident memory added by loading this side
    weight_mb: float | None = None  # stored weights (ONNX initializers)
    streamed_mb: float | None = None  # weight bytes read per decode step
    roofline_fraction: float | None = None  # decode tok/s / (bandwidth / streamed bytes)


@dataclass
class BenchReport:
    """The side-by-side result of one `autoplan bench` run."""

    workload: dict[str, int]
    sides: list[SideStats]
    threads: int
    peak_rss_mb: float
    bandwidth_gbps: float | None = None  # median of the samples when sampled per round
    bandwidth_samples_gbps: list[float] = field(default_factory=list)
    predicted: dict[str, Any] | None = None  # cost-model prediction for `local` (integration)
    notes: list[str] = field(default_factory=list)

    def side(self, name: str) -> SideStats:
        return next(s for s in self.sides if s.name == name)

    def ratios(self, name: str, baseline: str = "baseline") -> dict[str, float]:
        """Speed of `name` relative to `baseline` (>1 = faster)."""
        a, b = self.side(name), self.side(baseline)
        return {"decode_tok_s": a.decode_tok_s / b.decode_tok_s,
                "prefill_tok_s": a.prefill_tok_s / b.prefill_tok_s,
                "ttft_p50": b.ttft_ms["p50"] / a.ttft_ms["p50"],
                "tpot_p50": b.tpot_ms["p50"] / a.tpot_ms["p50"] if a.tpot_ms["p50"] else 0.0}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        names = [s.name for s in self.sides]
        if "baseline" in names:
            out["ratios_vs_baseline"] = {n: self.ratios(n) for n in names if n != "baseline"}
        return out


def summarize(name: str, runtime: str, results: list[GenerationResult], rss_load: int,
              weight_bytes: int | None = None, streamed_bytes: int | None = None,
              bandwidth: float | None = None) -> SideStats:
    """Fold the batches of one side into SideStats.

    Each request of a static batch shares the batch's TTFT and TPOT, so request-level
    percentiles weight every batch by its size (numpy's linear interpolation).
    """
    ttft = np.concatenate([[r.ttft_s] * r.batch for r in results]) * 1e3
    tpot = np.concatenate([[r.tpot_s] * r.batch for r in results]) * 1e3
    decode = float(np.median([r.decode_tok_s for r in results]))
    roof = None
    if streamed_bytes and bandwidth:
        batch = results[0].batch  # weights are read once per step for the whole batch
        roof = decode / (batch * bandwidth / streamed_bytes)
    return SideStats(
        name=name, runtime=runtime, requests=int(ttft.size),
        prefill_tok_s=float(np.median([r.prefill_tok_s for r in results])),
        decode_tok_s=decode,
        ttft_ms={f"p{p}": float(np.percentile(ttft, p)) for p in PERCENTILES},
        tpot_ms={f"p{p}": float(np.percentile(tpot, p)) for p in PERCENTILES},
        rss_load_mb=rss_load / 1e6,
        weight_mb=weight_bytes / 1e6 if weight_bytes else None,
        streamed_mb=streamed_bytes / 1e6 if streamed_bytes else None,
        roofline_fraction=roof,
    )


__all__ = ["BenchReport", "PERCENTILES", "SideStats", "summarize"]
