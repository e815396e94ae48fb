"""Mixture-of-experts terms of the cost model: what a step reads of the routed experts, the
grouped expert GEMMs, and the router.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplan.cost.efficiency import FamilyEfficiency
from autoplan.cost.fixed import PhaseTime
from autoplan.cost.linear import call_overhead, gemm_time
from autoplan.errors import UserInputError
from autoplan.formats import Choice, Precision, Sparsity
from autoplan.modelspec import LinearLayer, ModelSpec
from autoplan.runtimes import supports
from autoplan.targets import Target

GROUPED_GEMM_EFF = 1.0  # [DEEPGEMM]: grouped / normal FP8 GEMM at equal rows, 0.99 and 1.07
EXPERT_GEMMS = 2  # per MoE block: the gate/up grouped GEMM and the down one
ROUTING_KERNELS = 3  # per MoE block: top-k softmax, moe_align_block_size, moe_sum


@dataclass(frozen=True)
class Routing:
    """Per MoE block, the share of tokens routed to each expert (each block's shares sum to
    top_k), and where they come from."""

    shares: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    source: str = "uniform"

    @classmethod
    def uniform(cls, spec: ModelSpec) -> Routing:
        """Every expert picked by top_k / E of the tokens (no calibration routing known)."""
        moe = spec.moe
        if moe is None:
            return cls()
        share = (moe.top_k / moe.n_experts,) * moe.n_experts
        return cls({b: share for b in moe.moe_blocks}, "uniform")

    @classmethod
    def from_counts(cls, spec: ModelSpec, counts: Mapping[int | str, Sequence[int]],
                    tokens: int) -> Routing:
        """Shares from the calibration routing: counts[block][e] = tokens that picked e.

        Each expert gets one pseudo-pick (Laplace's rule of succession, the posterior mean
        under a uniform prior): a calibration set that never routed to an expert does not
        show it is never picked, and a share of 0 would cost it as never read at any batch.
        With top_k = E every share stays exactly 1.

        Raises:
            UserInputError: counts for another model (blocks or experts that do not match).
        """
        moe = spec.moe
        if moe is None or tokens <= 0:
            raise UserInputError("routing counts need a mixture-of-experts model and tokens")
        shares = {}
        for block in moe.moe_blocks:
            row = counts.get(block, counts.get(str(block)))  # type: ignore[call-overload]
            if row is None or len(row) != moe.n_experts:
                raise UserInputError(f"routing counts of block {block} do not match the model's "
                                     f"{moe.n_experts} experts; re-run the profile")
            picks = sum(row) + moe.n_experts
            shares[block] = tuple(moe.top_k * (c + 1) / picks for c in row)
        return cls(shares, f"calibration routing ({tokens} tokens)")

    @classmethod
    def from_json(cls, spec: ModelSpec, doc: Mapping[str, Any] | None) -> Routing:
        """What `to_json` wrote (a plan's `routing`); uniform when absent or for another model."""
        moe = spec.moe
        if moe is None or not doc:
            return cls.uniform(spec)
        shares = {int(b): tuple(float(x) for x in s) for b, s in doc.get("shares", {}).items()}
        if set(shares) != set(moe.moe_blocks) or any(len(s) != moe.n_experts
                                                     for s in shares.values()):
            return cls.uniform(spec)
        return cls(shares, str(doc.get("source", "plan")))

    @classmethod
    def of_profile(cls, spec: ModelSpec, counts: Mapping[str, Sequence[int]],
                   tokens: int) -> Routing:
        """The profile's calibration routing, or uniform when it recorded none."""
        if spec.moe is None or not counts or tokens <= 0:
            return cls.uniform(spec)
        return cls.from_counts(spec, counts, tokens)

    def share(self, block: int, expert: int) -> float:
        return self.shares[block][expert]

    def expected_distinct(self, block: int, tokens: float) -> float:
        """Expected number of a block's experts a step of `tokens` tokens touches."""
        return sum(touched(p, tokens) for p in self.shares[block])

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "shares": {str(b): list(s) for b, s in self.shares.items()}}


def touched(share: float, tokens: float) -> float:
    """Chance that at least one of `tokens` independent tokens picks an expert of this share."""
    if share >= 1.0:
        return 1.0
    return 1.0 - math.exp(tokens * math.log1p(-share)) if share > 0 else 0.0


def expert_rows(share: float, tokens: float) -> int:
    """Rows a routed expert's GEMM gets in a step of `tokens` tokens when the step picks it:
    its expected rows (tokens x share) over the chance it is picked, at least 1. A measured
    kernel table times routed experts at these rows (backends/cpu/predict.kernel_rows)."""
    reads = touched(share, tokens)
    return max(1, round(tokens * share / reads)) if reads else 1


def expert_takes(choice: Choice) -> bool:
    """Whether a routed expert may be stored in `choice`: dense formats only, since no
    engine runs its grouped expert GEMMs on 2:4 or block-sparse weights."""
    return choice.sparsity.kind == "dense"


def uniform_with_experts(spec: ModelSpec, choice: Choice,
                         experts: Choice) -> Choice | dict[str, Choice]:
    """`choice` on every linear layer, routed experts in `experts` (routed_expert_choice)."""
    if spec.moe is None or experts == choice:
        return choice
    return {la.name: experts if la.expert >= 0 else choice for la in spec.layers}


def routed_expert_choice(spec: ModelSpec, target: Target, runtime: str, choice: Choice,
                         baseline: Choice) -> tuple[Choice, str]:
    """What the routed experts of a uniform `choice` are stored in, and why when it is not
    `choice`: dense where they cannot take its sparsity, the baseline where the runtime's
    fused-MoE kernels refuse the format (the rules the search's space applies)."""
    if spec.moe is None:
        return choice, ""
    experts, why = choice, ""
    if not expert_takes(choice):
        experts = Choice(Sparsity(), choice.precision)
        why = f"no engine runs grouped expert GEMMs on {choice.sparsity} weights"
    rule = supports(target, runtime, experts, "routed_experts")
    if experts != baseline and not rule.ok:
        return baseline, rule.reason
    return experts, why


def expert_members(spec: ModelSpec) -> int:
    """Routed-expert linear layers per MoE block (E x projections)."""
    moe = spec.moe
    return moe.n_experts * len(moe.projections) if moe is not None else 0


def expert_step(target: Target, eff: FamilyEfficiency, layer: LinearLayer, choice: Choice,
                share: float, tokens: float, baseline: Precision) -> float:
    """Seconds of one routed expert's GEMM in a step of `tokens` tokens (no overhead)."""
    return gemm_time(target, eff, choice, tokens * share, layer.out_features,
                     layer.in_features, baseline, weight_reads=touched(share, tokens),
                     compute_eff=GROUPED_GEMM_EFF).seconds


def expert_overhead(target: Target, eff: FamilyEfficiency, choice: Choice, members: int) -> float:
    """One expert layer's share of its block's two grouped-GEMM calls."""
    return call_overhead(target, eff, choice) * EXPERT_GEMMS / members


def routing_time(spec: ModelSpec, eff: FamilyEfficiency, batch: int, prefill_tokens: int,
                 chunks: int, bandwidth: float, peak: float) -> PhaseTime:
    """Router GEMMs (16-bit: E x hidden weights, read once per step) and routing kernels of
    every MoE block; bandwidth and peak are the achieved ones (eta included)."""
    moe = spec.moe
    if moe is None:
        return PhaseTime(0.0, 0.0)
    blocks = len(moe.moe_blocks)
    weights = moe.router_params(spec.hidden) / blocks * 2.0  # bytes per block, 16 bit

    def gemm(tokens: int) -> float:
        flops = 2.0 * tokens * moe.n_experts * spec.hidden
        traffic = weights + tokens * (spec.hidden + moe.n_experts) * 2.0
        return max(traffic / bandwidth, flops / peak)

    kernels = (ROUTING_KERNELS + 1) * eff.kernel_s
    decode = blocks * (gemm(batch) + kernels)
    prefill = blocks * (gemm(prefill_tokens) + chunks * kernels)
    return PhaseTime(prefill, decode)


__all__ = ["EXPERT_GEMMS", "GROUPED_GEMM_EFF", "ROUTING_KERNELS", "Routing", "expert_members",
           "expert_overhead", "expert_rows", "expert_step", "expert_takes", "routed_expert_choice",
           "routing_time", "touched", "uniform_with_experts"]
