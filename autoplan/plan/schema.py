"""The plan file: the versioned, auditable result of `autoplan search`.

`schema_version` is independent of the package version. Plans written by an older schema are
migrated on load (autoplan/plan/io.py); a plan from a newer autoplan is refused with a
message to upgrade. Every model forbids unknown keys, so a typo never passes silently.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


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
    """Exact optimum of the additive surrogate problem and the search's gap to it."""

    solver: str
    optimum_objective: float
    search_objective: float
    gap: float
    surrogate_limit: float


class SearchMeta(_Strict):
    sampler: str
    seed: int
    trials: int
    wall_time_s: float
    study: str
    storage: str = Field(description="storage URL with any password removed")
    real_evaluations: int
    rounds: list[dict[str, Any]] = []
    certificate: Certificate | None = None
    gain_over_best_uniform: float | None = None
    best_uniform: str | None = None
    best_uniform_kl: float | None = Field(None, description="measured KL of the best uniform recipe")
    outcome: str = Field(description="'plan' | 'uniform-fallback' | 'baseline-fallback'")
    note: str = ""
    # The objective vs KL of every uniform recipe and every measured candidate (and the
    # study's Pareto front with --multi-objective): what `autoplan report` plots.
    points: list[dict[str, Any]] = []


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
    workload: dict[str, int]
    objective: str
    budget: Budget
    compression: Compression
    decisions: dict[str, str] = Field(description="layer name -> 'sparsity+precision'")
    predicted: dict[str, Predicted] = Field(description="plan, baseline, best_uniform")
    quality: Quality
    search: SearchMeta
    audit: Audit
    # How the workload's batch was chosen when it was not given (`--batch max`, a TTFT/TPOT
    # SLO): mode, batch, what bounds it, one line of detail (autoplan/cost/operating.py).
    operating_point: dict[str, Any] | None = None
    recovery: Recovery | None = None
    # Mixture-of-experts: the routing shares the predictions assumed (the profile's
    # calibration routing, per block the share of tokens each expert gets; cost/moe.py)
    routing: dict[str, Any] | None = None


__all__ = [
    "SCHEMA_VERSION", "Audit", "Budget", "CalibrationSettings", "Certificate", "Compression",
    "GateScore", "ModelRef", "Plan", "Predicted", "Quality", "Recovery", "RuntimeRef",
    "SearchMeta", "TargetRef",
]
