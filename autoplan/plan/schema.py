"""The plan file: the versioned, auditable result of `autoplan search`.

`schema_version` is independent of the package version. Plans written by an older schema are
migrated on load (autoplan/plan/io.py); a plan from a newer autoplan is refused with a
message to upgrade. Every model forbids unknown keys, so a typo never passes silently.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autoplan.workload import Workload

# 2: rounds, points and the operating point are typed models, outcome a Literal (a version 1
# plan holds the same keys; autoplan/plan/io.py migrates it)
# 3: the KV cache (`kv_cache`), the serving command (`deploy`), `quality.kl_long`
# 4: why the search stopped and what the plan holds, the per-family calibration of each
# round, the speed uncertainty and quality reference; outcome "as-is" (a quantized source
# returned unchanged); a version 3 plan lacks only these (their defaults)
# 5: the machine a `local` plan was searched on (`target.machine`)
SCHEMA_VERSION = 5

Outcome = Literal["plan", "uniform-fallback", "baseline-fallback", "as-is"]
PointKind = Literal["baseline", "as-is", "uniform", "candidate", "front", "plan"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Strict):
    id: str
    content_hash: str
    model_type: str
    n_layers: int
    params: int


class TargetRef(_Strict):
    name: str
    price_per_hour: float
    price_source: str
    machine: str | None = Field(None, description="`local`: the CPU the search measured "
                                "(model, cores, threads); None for a catalog target")

    @property
    def shown(self) -> str:
        """The name as show and the report print it: with the machine a local plan is of."""
        return f"{self.name} [{self.machine}]" if self.machine else self.name


class RuntimeRef(_Strict):
    name: str
    version: str


class Budget(_Strict):
    text: str = Field(description="as the user wrote it, e.g. 'kl<=0.05'")
    metric: str = Field(description="kl | ppl | suite | slice | gate")
    limit: float = Field(description="kl: nats/token; ppl: max relative increase; suite: min points change")
    suite_file: str | None = None
    name: str | None = Field(None, description="slice: its name; gate: longctx | lm-eval:TASK")
    also: list[str] = Field([], description="further budgets the plan must meet (gates)")


class Compression(_Strict):
    prune_score: str
    quant_method: str


class Predicted(_Strict):
    """Cost-model predictions (never measurements) for one set of decisions."""

    label: str
    tokens_per_s: float
    ttft_s: float
    tpot_s: float
    request_latency_s: float
    memory_gb: float
    fits: bool
    energy_j_per_token: float
    usd_per_1m_tokens: float
    weight_gb: float
    # weight GB one token reads (a mixture-of-experts model: top_k of each block's experts)
    active_weight_gb: float | None = None


class GateScore(_Strict):
    """A gate's score (points, higher is better) beside the original model's."""

    score: float
    reference: float
    detail: dict[str, float] = {}


class Quality(_Strict):
    """Quality measured on the real compressed model, next to the surrogate's prediction."""

    kl: float
    ppl: float
    ppl_ref: float
    suite_score: float | None = None
    suite_ref: float | None = None
    surrogate_kl: float
    budget_met: bool
    eval_tokens: int
    slices: dict[str, float] = Field({}, description="slice -> mean KL over its positions")
    gates: dict[str, GateScore] = Field({}, description="longctx, lm-eval:TASK")
    kl_long: float | None = Field(None, description="KL on the long-prompt split (>= 2k "
                                                   "tokens), measured with a compressed KV cache")


class Recovery(_Strict):
    """The recovery pass that trained the plan's compressed layers (``--recover``).

    The recovered weights live in ``weights_file`` beside the plan (sha256 checked);
    ``audit.tensors`` holds the digests of the layers after recovery and re-quantization,
    ``unrecovered_tensors`` those before (the base an adapter-serving engine loads).
    """

    method: str = Field(description="distill | lora")
    settings: dict[str, Any]
    text_source: str
    text_hash: str
    weights_file: str
    weights_sha256: str
    layers: int
    steps_run: int
    resumed_from: int = 0
    seconds: float
    cpu_seconds: float
    loss_first: float
    loss_last: float
    unrecovered: Quality
    unrecovered_tensors: dict[str, dict[str, str]]
    adapter_kl: float | None = Field(None, description="lora: KL of base + unmerged adapter")
    lora_scaling: float | None = None


class Certificate(_Strict):
    """Exact optimum of the additive surrogate problem (calibrated per format family) and
    the search's gap to it."""

    solver: str
    optimum_objective: float
    search_objective: float
    gap: float = Field(description="the search's best over the optimum, in the time the "
                       "objective is monotone in (request time; TPOT for tpot), minus 1")
    surrogate_limit: float


class VerifiedCandidate(_Strict):
    """One candidate of a round measured on the real model."""

    label: str
    surrogate_kl: float
    predicted: float | None = Field(None, description="the calibrated surrogate: predicted "
                                    "badness")
    badness: float = Field(description="the budget's measured metric (0: the original)")
    passed: bool


class Round(_Strict):
    """One round: a study under a surrogate limit, then its best candidates measured."""

    round: int
    study: str = ""
    surrogate_limit: float = Field(description="limit on the calibrated surrogate (predicted "
                                   "badness)")
    aim: float | None = Field(None, description="the limit over the budget")
    calibration: dict[str, Any] = Field({}, description="the round's per-family scales")
    trials: int
    resumed_trials: int = Field(0, description="trials found in the storage, not rerun")
    verified: list[VerifiedCandidate] = []


class Point(_Strict):
    """Objective (predicted) vs KL of one set of decisions: what `autoplan report` plots."""

    kind: PointKind
    label: str
    objective: float
    surrogate_kl: float
    measured_kl: float | None = None
    measured_kl_lower_bound: bool | None = Field(
        None, description="the pass stopped once the budget was certain to be exceeded")
    passed: bool | None = None


class OperatingPoint(_Strict):
    """How the workload's batch was chosen when it was not given (`--batch max`, an SLO)."""

    mode: Literal["fixed", "max", "slo"]
    batch: int
    bound: str = Field(description="fixed | memory | ttft | tpot | batch cap")
    detail: str
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None


class KvAlternative(_Strict):
    """One KV-cache format the search tried: its own operating point and best plan."""

    format: str
    batch: int
    objective: float = Field(description="the objective of its best plan (predicted)")
    measured_kl: float | None = None
    kl_long: float | None = None
    passed: bool
    outcome: Outcome


class KvCache(_Strict):
    """The plan's KV cache: one format for every block (no engine mixes them), how it is
    rounded and scaled, what it stores, and what the search compared it with."""

    format: str = Field(description="autoplan.formats.kv name, e.g. fp8_e4m3, q8_0")
    default: str = Field(description="the runtime's own cache (uncompressed reference)")
    flag: str = Field(description="the engine's value for it (--kv-cache-dtype, -ctk/-ctv)")
    scales: Literal["checkpoint", "dynamic", "none"] = Field(
        description="checkpoint: static K/V scales calibrated here and exported")
    query: str | None = Field(None, description="the engine's query rounding, simulated")
    per_layer: bool = False
    bytes_per_token: float = Field(description="cache bytes per token of context, all blocks")
    bytes_per_sequence: float
    scale_digests: dict[str, str] = Field({}, description="block -> sha256 of its K/V scales")
    long_split_tokens: int | None = Field(None, description="tokens per long-prompt block")
    alternatives: list[KvAlternative] = []


class Deploy(_Strict):
    """The engine's launch command for the exported artifact (autoplan/deploy.py)."""

    runtime: str
    command: list[str] = Field(description="argv; {MODEL} stands for the exported artifact")
    shell: str
    env: dict[str, str] = {}
    files: dict[str, str] = Field({}, description="files the command reads, by name")
    settings: dict[str, Any] = {}
    note: str = ""


class SearchMeta(_Strict):
    sampler: str
    seed: int
    trials: int
    wall_time_s: float
    study: str
    storage: str = Field(description="storage URL with any password removed")
    real_evaluations: int
    rounds: list[Round] = []
    certificate: Certificate | None = None
    gain_over_best_uniform: float | None = None
    best_uniform: str | None = None
    best_uniform_kl: float | None = Field(None, description="measured KL of the best uniform recipe")
    outcome: Outcome
    note: str = ""
    stopped: str = Field("", description="why the rounds of the search stopped")
    why: str = Field("", description="why the plan holds what it holds: the fastest "
                     "acceptable candidate, or the noise rule's better-quality one")
    calibration: dict[str, Any] = Field({}, description="the last round's measured badness "
                                        "per surrogate nat, per format family")
    speed_uncertainty: dict[str, Any] = Field({}, description="relative uncertainty of "
                                              "predicted speed ratios here, and its source")
    quality_reference: str = Field("", description="what measured quality is relative to")
    # Every uniform recipe and measured candidate (and the Pareto front, multi-objective)
    points: list[Point] = []


class CalibrationSettings(_Strict):
    """How the calibration/evaluation tokens were drawn, so apply/export can rebuild them."""

    seq_len: int
    n_calib: int
    n_eval: int
    seed: int
    batch_size: int


class Audit(_Strict):
    calibration_source: str
    calibration_hash: str
    calibration: CalibrationSettings | None = None
    tensors: dict[str, dict[str, str]] = Field(
        description="layer -> {tensor name -> sha256} for every mask and scale tensor"
    )
    # SparseGPT/GPTQ weights reproduce bit for bit only on the torch thread count they were
    # solved on (autoplan/numerics.py); None: the plan's weights do not depend on it
    solver_threads: int | None = None
    solver_numerics: str | None = Field(None, description="torch build and CPU kernels")


class Plan(_Strict):
    schema_version: int = SCHEMA_VERSION
    autoplan_version: str
    created: str
    model: ModelRef
    target: TargetRef
    runtime: RuntimeRef
    workload: Workload
    objective: str
    budget: Budget
    compression: Compression
    decisions: dict[str, str] = Field(description="layer name -> 'sparsity+precision'")
    predicted: dict[str, Predicted] = Field(description="plan, baseline, best_uniform")
    quality: Quality
    search: SearchMeta
    audit: Audit
    operating_point: OperatingPoint | None = None
    recovery: Recovery | None = None
    # Mixture-of-experts: the routing shares the predictions assumed (the profile's
    # calibration routing, per block the share of tokens each expert gets; cost/moe.py)
    routing: dict[str, Any] | None = None
    kv_cache: KvCache | None = None
    deploy: Deploy | None = None

    @field_validator("routing")
    @classmethod
    def _routing_shares(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """cost/moe.Routing.to_json's shape: report and fleet price the plan with it."""
        if value is None:
            return None
        shares = value.get("shares")
        if not isinstance(shares, dict) or not all(
                isinstance(block, str) and block.isdigit() and isinstance(row, list) and row
                and all(_share(x) for x in row) for block, row in shares.items()):
            # pydantic turns a ValueError (not a TypeError) into its one-line validation error
            raise ValueError("'shares' must map block indices to lists of non-negative "
                             "numbers, each expert's share of the tokens")
        if not isinstance(value.get("source", ""), str):
            raise ValueError("'source' must be a string")  # noqa: TRY004
        return value


def _share(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x >= 0)


__all__ = [
    "SCHEMA_VERSION", "Audit", "Budget", "CalibrationSettings", "Certificate", "Compression",
    "Deploy", "GateScore", "KvAlternative", "KvCache", "ModelRef", "OperatingPoint", "Outcome", "Plan", "Point", "PointKind",
    "Predicted", "Quality", "Recovery", "Round", "RuntimeRef", "SearchMeta", "TargetRef",
    "VerifiedCandidate", "Workload",
]
