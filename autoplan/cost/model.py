"""CostModel: predicted prefill and decode step times of a model on a target for a workload.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from autoplan.cost.efficiency import baseline_precision, family_efficiency
from autoplan.cost.fixed import ZERO, FixedCost, PhaseTime, fixed_cost
from autoplan.cost.kv import KvInput, KvLayout, bytes_per_token, cache_bytes
from autoplan.cost.linear import call_overhead, gemm_time, math_peak, stored_bits
from autoplan.cost.measured import MeasuredTable
from autoplan.cost.moe import (Routing, expert_members, expert_overhead, expert_rows,
                               expert_step, routing_time, touched)
from autoplan.cost.report import (Estimate, KvSummary, LayerBreakdown, Memory, Metrics,
                                  Objective, metrics_from_times)
from autoplan.errors import UnknownNameError, UserInputError
from autoplan.formats import DENSE, Choice
from autoplan.modelspec import LinearLayer, ModelSpec
from autoplan.targets import Target
from autoplan.workload import Workload

Decisions = Choice | str | Mapping[str, Choice | str] | None

# vLLM's default gpu_memory_utilization: the share of device memory a runtime plans with.
USABLE_MEMORY = 0.90
# Prefill tokens per engine step (vLLM / TensorRT-LLM max_num_batched_tokens default order).
PREFILL_CHUNK = 8192


class CostModel:
    """Analytic cost model for one (model, target, workload).

    Args:
        spec: the model architecture (dense models only; ModelSpec refuses MoE).
        target: the hardware.
        workload: batch, input and output lengths.
        measured: optional microbenchmark document ({"rows": [{"m","n","k","choice",
            "median_us"}]}); an exact (m, n, k, choice) row replaces the analytic GEMM time.
        kv_bytes: bytes per KV-cache element (2 = 16-bit cache), when ``kv`` is not given.
        kv: the KV-cache format, one for every block or one per block (cost/kv.py); it sets
            the bytes each decode step reads and the memory the cache takes.
        price_per_hour: $/hour for the device; default the target's catalog price.
        baseline: the format of layers a decision leaves out (default: the target's usual
            serving dtype, bf16 where the chip has bf16 math, else fp32).
        prefill_chunk: prompt tokens one prefill step runs (default PREFILL_CHUNK); a
            runtime's own setting where it is known (trtllm-bench: cost/trtllm_bench.py).
        routing: a mixture-of-experts model's routing shares per expert (the profile's
            calibration routing); default uniform, top_k / E each.
    """

    def __init__(self, spec: ModelSpec, target: Target, workload: Workload, *,
                 measured: Mapping[str, Any] | None = None, kv_bytes: float = 2.0,
                 price_per_hour: float | None = None, baseline: Choice | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, routing: Routing | None = None,
                 kv: KvInput | KvLayout | None = None) -> None:
        self.spec, self.target, self.workload = spec, target, workload
        self.routing = routing if routing is not None else Routing.uniform(spec)
        self._members = expert_members(spec)
        self.eff = family_efficiency(target)
        self.baseline = baseline or Choice(DENSE, baseline_precision(target))
        if isinstance(kv, KvLayout):
            self.kv = kv
        else:
            self.kv = KvLayout.uniform_bytes(spec, kv_bytes) if kv is None else KvLayout.of(spec, kv)
        self.price_per_hour = target.price_per_hour.value if price_per_hour is None else price_per_hour
        if not 0 <= self.price_per_hour < math.inf:  # NaN would make every trial NaN
            raise UserInputError(f"price per hour must be a finite number >= 0, got "
                                 f"{self.price_per_hour}")
        self.measured = MeasuredTable.from_document(measured)
        if prefill_chunk < 1:
            raise UserInputError(f"prefill chunk must be >= 1 token, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        self._groups = Counter(layer.fuse_group for layer in spec.layers)
        self._group_n: Counter[str] = Counter()
        for layer in spec.layers:
            self._group_n[layer.fuse_group] += layer.out_features
        self._memo: dict[tuple, PhaseTime] = {}
        tokens = workload.batch * workload.input_len
        self._chunks = math.ceil(tokens / prefill_chunk)
        self._chunk_m = min(tokens, prefill_chunk)
        self._last_m = tokens - (self._chunks - 1) * self._chunk_m
        self._fixed: FixedCost | None = None

    # ---- per-layer terms ---------------------------------------------------------------
    def _gemm(self, choice: Choice, m: int, n: int, k: int, group_n: int = 0) -> tuple[float, bool]:
        """(seconds, measured?) of one member's GEMM; a measured packed-group row (m, group_n,
        k) is shared by output width, else an exact per-layer row, else the roofline."""
        if group_n > n:
            hit = self.measured.seconds(m, group_n, k, choice)
            if hit is not None:
                return hit * n / group_n, True
        hit = self.measured.seconds(m, n, k, choice)
        if hit is not None:
            return hit, True
        return gemm_time(self.target, self.eff, choice, m, n, k,
                         self.baseline.precision).seconds, False

    def _call(self, choice: Choice, m: int, n: int, k: int, group_n: int,
              overhead: float) -> float:
        seconds, measured = self._gemm(choice, m, n, k, group_n)
        if measured and self.measured.includes_dispatch:
            return seconds
        return seconds + overhead

    def layer_time(self, layer: LinearLayer, choice: Choice) -> PhaseTime:
        """Prefill (whole batch) and decode-step seconds of one linear layer under a choice."""
        if layer.expert >= 0:
            return self._expert_time(layer, choice)
        lm_head = layer.role == "lm_head"
        group = self._groups.get(layer.fuse_group, 1)
        group_n = self._group_n.get(layer.fuse_group, layer.out_features) if group > 1 else 0
        key = (layer.in_features, layer.out_features, lm_head, group, group_n, choice)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        n, k, b = layer.out_features, layer.in_features, self.workload.batch
        overhead = call_overhead(self.target, self.eff, choice) / group
        decode = self._call(choice, b, n, k, group_n, overhead)
        if lm_head:  # logits only for each sequence's last prompt position
            prefill = decode
        else:
            prefill = (self._chunks - 1) * self._call(choice, self._chunk_m, n, k, group_n,
                                                      overhead)
            prefill += self._call(choice, self._last_m, n, k, group_n, overhead)
        result = PhaseTime(prefill, decode)
        self._memo[key] = result
        return result

    def _expert_time(self, layer: LinearLayer, choice: Choice) -> PhaseTime:
        """A routed expert: its share of each step's expert reads and rows (cost/moe.py)."""
        share = self.routing.share(layer.block, layer.expert)
        key = ("expert", layer.in_features, layer.out_features, share, choice)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        base = self.baseline.precision
        overhead = expert_overhead(self.target, self.eff, choice, self._members)

        def step(tokens: int) -> float:
            """One step of `tokens` tokens, its share of the grouped-GEMM calls included."""
            hit = self.measured.seconds(expert_rows(share, tokens), layer.out_features,
                                        layer.in_features, choice)
            if hit is not None:  # a measured GEMM of the rows a picked expert gets, if picked
                return touched(share, tokens) * hit + (
                    0.0 if self.measured.includes_dispatch else overhead)
            return expert_step(self.target, self.eff, layer, choice, share, tokens,
                               base) + overhead

        decode = step(self.workload.batch)
        prefill = (self._chunks - 1) * step(self._chunk_m) + step(self._last_m)
        result = PhaseTime(prefill, decode)
        self._memo[key] = result
        return result

    def decode_read_share(self, layer: LinearLayer) -> float:
        """Share of a layer's weights one decode step reads (a routed expert: the chance
        the batch picks it; every other layer: 1)."""
        if layer.expert < 0:
            return 1.0
        return touched(self.routing.share(layer.block, layer.expert), self.workload.batch)

    def fixed_time(self) -> PhaseTime:
        """Attention, norms/elementwise, embeddings/sampling and fixed overheads."""
        return self._fixed_cost().total

    def _fixed_cost(self) -> FixedCost:
        if self._fixed is None:
            peak = math_peak(self.target, self.baseline, self.baseline.precision)
            fixed = fixed_cost(self.spec, self.target, self.eff, self.workload, peak,
                               self.kv, self.prefill_chunk)
            if self.spec.moe is not None:
                w = self.workload
                fixed.parts["moe_routing"] = routing_time(
                    self.spec, self.eff, w.batch, w.batch * w.input_len, self._chunks,
                    self.eff.eta_bw * self.target.bandwidth, self.eff.eta_c * peak)
            measured = self.measured.non_gemm_decode_s
            if measured is not None:  # a measured decode step without its GEMMs
                parts = {k: PhaseTime(v.prefill_s, 0.0) for k, v in fixed.parts.items()}
                parts["measured_non_gemm"] = PhaseTime(0.0, measured)
                fixed = FixedCost(parts, fixed.kv_read_bytes, fixed.kv_blocks)
            self._fixed = fixed
        return self._fixed

    # ---- decisions -----------------------------------------------------------------------
    def resolve(self, decisions: Decisions) -> tuple[Choice, ...]:
        """One Choice per linear layer, in ``spec.layers`` order (missing -> baseline)."""
        if decisions is None:
            return (self.baseline,) * len(self.spec.layers)
        if isinstance(decisions, (Choice, str)):
            choice = Choice.parse(decisions) if isinstance(decisions, str) else decisions
            return (choice,) * len(self.spec.layers)
        names = {layer.name for layer in self.spec.layers}
        for name in decisions:
            if name not in names:
                raise UnknownNameError("layer", name, names)
        out = []
        for layer in self.spec.layers:
            choice = decisions.get(layer.name, self.baseline)
            out.append(Choice.parse(choice) if isinstance(choice, str) else choice)
        return tuple(out)

    def step_times(self, decisions: Decisions) -> PhaseTime:
        """Fast path: total prefill and decode step seconds (sum of layer terms + fixed)."""
        total = self.fixed_time()
        prefill, decode = total.prefill_s, total.decode_s
        for layer, choice in zip(self.spec.layers, self.resolve(decisions)):
            t = self.layer_time(layer, choice)
            prefill += t.prefill_s
            decode += t.decode_s
        return PhaseTime(prefill, decode)

    def metric_from_times(self, prefill_s: float, decode_s: float,
                          objective: Objective | str) -> float:
        """One objective from step times (units and direction: report.Objective, DIRECTION)."""
        return getattr(self._metrics(prefill_s, decode_s), Objective(objective).value)

    def _metrics(self, prefill_s: float, decode_s: float) -> Metrics:
        return metrics_from_times(prefill_s, decode_s, self.workload,
                                  price_per_hour=self.price_per_hour,
                                  power_w=self.eff.power_frac * self.target.tdp_w.value)

    # ---- full estimate -------------------------------------------------------------------
    def memory(self, choices: tuple[Choice, ...]) -> Memory:
        """Weights (as stored) + KV cache at batch x (input + output) + activation workspace."""
        spec, w = self.spec, self.workload
        base_bytes = self.baseline.precision.info.weight_bits / 8
        weights = sum(layer.params * stored_bits(self.target, c) / 8
                      for layer, c in zip(spec.layers, choices))
        lm_choice = choices[-1] if spec.layers[-1].role == "lm_head" else self.baseline
        # the input embedding as the artifact stores it: a GGUF export keeps the source's
        # token_embd (and ties lm_head to it when lm_head is planned in its type)
        kept = self.measured.embedding_bits
        embedding = self.measured.embedding_choice if kept is not None else self.baseline
        if not (spec.tie_embeddings and lm_choice == embedding):
            weights += spec.embedding_params * (base_bytes if kept is None else kept / 8)
        weights += (2 * spec.n_layers + 1) * spec.hidden * base_bytes  # norms
        weights += spec.unlisted_params * base_bytes  # MoE routers, gpt-oss biases and sinks
        kv = cache_bytes(spec, self.kv, w.batch, w.input_len + w.output_len)
        widest = spec.attention_widest + 2 * spec.active_intermediate
        workspace = self._chunk_m * (widest + 2 * spec.hidden) * 2 + w.batch * spec.vocab * 4
        return Memory(weights, kv, workspace, self.target.memory_bytes * USABLE_MEMORY)

    def evaluate(self, decisions: Decisions = None) -> Estimate:
        """Every predicted metric with the per-layer breakdown."""
        choices = self.resolve(decisions)
        rows = []
        for layer, choice in zip(self.spec.layers, choices):
            t = self.layer_time(layer, choice)
            rows.append(LayerBreakdown(layer.name, layer.role, str(choice), t.prefill_s,
                                       t.decode_s, layer.params * stored_bits(self.target, choice) / 8))
        fixed = self._fixed_cost()
        total = fixed.total
        for row in rows:
            total = total + PhaseTime(row.prefill_s, row.decode_s)
        memory = self.memory(choices)
        read = sum(r.weight_bytes * self.decode_read_share(layer)
                   for r, layer in zip(rows, self.spec.layers)) + fixed.kv_read_bytes
        return Estimate(
            model=self.spec.name or self.spec.model_type, target=self.target.name,
            workload=self.workload.model_dump(), baseline=str(self.baseline),
            metrics=self._metrics(total.prefill_s, total.decode_s), memory=memory,
            mbu=read / total.decode_s / self.target.bandwidth if total.decode_s else 0.0,
            layers=tuple(rows), fixed={k: v for k, v in fixed.parts.items()},
            active_weight_bytes=self.active_weight_bytes(choices),
            kv=self._kv_summary(fixed),
        )

    def _kv_summary(self, fixed: FixedCost) -> KvSummary:
        w = self.workload
        return KvSummary(self.kv.label(), bytes_per_token(self.spec, self.kv),
                         cache_bytes(self.spec, self.kv, 1, w.input_len + w.output_len),
                         fixed.kv_read_bytes, fixed.kv_blocks)

    def active_weight_bytes(self, choices: tuple[Choice, ...]) -> float:
        """Weight bytes one token reads as stored (each routed expert top_k / E of its
        bytes; the input embedding one row; modelspec.ModelSpec.active_params)."""
        spec = self.spec
        scale = spec.moe.top_k / spec.moe.n_experts if spec.moe is not None else 1.0
        linear = sum(layer.params * stored_bits(self.target, c) / 8 * (
            scale if layer.expert >= 0 else 1.0) for layer, c in zip(spec.layers, choices))
        base_bytes = self.baseline.precision.info.weight_bits / 8
        other = (2 * spec.n_layers + 1) * spec.hidden + spec.unlisted_params
        if spec.moe is not None:
            bias = spec.moe.expert_bias_params(spec.hidden)
            other -= bias * (1 - scale)
        return linear + other * base_bytes


__all__ = ["PREFILL_CHUNK", "USABLE_MEMORY", "ZERO", "CostModel", "Decisions"]
