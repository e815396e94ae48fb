"""Predicted metrics from the two step times, and the Estimate record the CLI prints.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autoplan.cost.fixed import KvBlockCost, PhaseTime
from autoplan.textenum import TextEnum
from autoplan.workload import Workload


class Objective(TextEnum):
    """What a search optimizes; DIRECTION says which way."""

    __noun__ = "objective"

    THROUGHPUT = "throughput"  # output tokens/s, end to end (maximize)
    COST = "cost"  # $ per 1M output tokens (minimize)
    ENERGY = "energy"  # J per output token (minimize)
    LATENCY = "latency"  # request latency in s (minimize)
    TPOT = "tpot"  # time per output token after the first, in s (minimize): streaming speed


DIRECTION = {Objective.THROUGHPUT: "maximize", Objective.COST: "minimize",
             Objective.ENERGY: "minimize", Objective.LATENCY: "minimize",
             Objective.TPOT: "minimize"}


def usd_per_million_tokens(tokens_per_s: float, price_per_hour: float) -> float:
    """$ per 1M tokens at a sustained rate: 800 tok/s at $4/h -> 1.389."""
    if tokens_per_s <= 0:
        return float("inf")
    return price_per_hour / (tokens_per_s * 3600.0) * 1e6


@dataclass(frozen=True)
class Metrics:
    """Predicted serving metrics of one configuration."""

    prefill_s: float
    decode_s: float
    ttft_s: float
    tpot_s: float
    request_latency_s: float
    decode_tokens_per_s: float
    throughput: float  # output tokens/s end to end
    cost: float  # $/1M output tokens
    energy: float  # J/output token
    latency: float  # = request_latency_s

    @property
    def tpot(self) -> float:
        """The TPOT objective's value (= tpot_s, the decode step)."""
        return self.tpot_s


def metrics_from_times(prefill_s: float, decode_s: float, workload: Workload, *,
                       price_per_hour: float, power_w: float) -> Metrics:
    """All metrics from the two step times (formulas: docs/modules.md)."""
    b, out = workload.batch, workload.output_len
    latency = prefill_s + (out - 1) * decode_s
    tps = b * out / latency if latency > 0 else float("inf")
    return Metrics(
        prefill_s=prefill_s, decode_s=decode_s, ttft_s=prefill_s, tpot_s=decode_s,
        request_latency_s=latency,
        decode_tokens_per_s=b / decode_s if decode_s > 0 else float("inf"),
        throughput=tps, cost=usd_per_million_tokens(tps, price_per_hour),
        energy=power_w * latency / (b * out), latency=latency,
    )


def metric_from_times(prefill_s: float, decode_s: float, objective: Objective | str,
                      workload: Workload, *, price_per_hour: float, power_w: float) -> float:
    """One objective's value (units and direction: Objective, DIRECTION)."""
    metrics = metrics_from_times(prefill_s, decode_s, workload, price_per_hour=price_per_hour,
                                 power_w=power_w)
    return getattr(metrics, Objective(objective).value)


@dataclass(frozen=True)
class Memory:
    """Device memory in bytes; ``capacity_bytes`` is the usable share of the device."""

    weights_bytes: float
    kv_cache_bytes: float
    workspace_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.workspace_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


@dataclass(frozen=True)
class LayerBreakdown:
    """One linear layer's predicted share of the step times."""

    name: str
    role: str
    choice: str
    prefill_s: float
    decode_s: float
    weight_bytes: float


@dataclass(frozen=True)
class KvSummary:
    """The KV cache of a prediction: its format, what one token and one sequence store, what
    one decode step reads, and each block's share (cost/kv.py)."""

    format: str
    bytes_per_token: float  # a full-attention token, every block
    bytes_per_sequence: float  # input + output tokens, sliding windows applied
    read_bytes: float  # one decode step, the whole batch
    blocks: tuple[KvBlockCost, ...] = ()


@dataclass(frozen=True)
class Estimate:
    """A full prediction: metrics, memory, MBU and where the time goes."""

    model: str
    target: str
    workload: dict[str, int]
    baseline: str
    metrics: Metrics
    memory: Memory
    mbu: float
    layers: tuple[LayerBreakdown, ...]
    fixed: dict[str, PhaseTime]
    active_weight_bytes: float = 0.0  # weight bytes one token reads (MoE: top_k experts)
    kv: KvSummary | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (all speed figures are predictions: ``predicted`` is true)."""
        memory = asdict(self.memory) | {"total_bytes": self.memory.total_bytes,
                                        "fits": self.memory.fits}
        return {
            "predicted": True, "model": self.model, "target": self.target,
            "workload": dict(self.workload), "baseline": self.baseline,
            "metrics": asdict(self.metrics), "memory": memory, "mbu": self.mbu,
            "active_weight_bytes": self.active_weight_bytes,
            "layers": [asdict(row) for row in self.layers],
            "fixed": {k: asdict(v) for k, v in self.fixed.items()},
            "kv": asdict(self.kv) if self.kv is not None else None,
        }


__all__ = ["DIRECTION", "Estimate", "KvSummary", "LayerBreakdown", "Memory", "Metrics", "Objective",
           "metric_from_times", "metrics_from_times", "usd_per_million_tokens"]
