"""`SearchRequest`: everything a search takes, as typed objects, checked when it is built.

The CLI builds one from its options, so every mistake that can be seen in the arguments
alone (a budget of `kl<=inf`, `--seed -1`, an unknown format, a malformed cost table) is
refused here, in milliseconds, before a model is resolved or a study journal is created.
Text is accepted for the parsed fields (budget, objective, choices, cost table) and parsed
in `__post_init__`, as `CompressionSettings` does, so library callers may write either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage

from autoplan.backends.registry import MEASURE_OR_TABLE
from autoplan.compress import CompressionSettings
from autoplan.cost.measured import load_cost_table
from autoplan.cost.operating import OperatingRequest
from autoplan.cost.report import Objective
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.formats.choice import parse_choices
from autoplan.formats.kv import KvFormat, parse_kv_mix
from autoplan.recover.settings import RecoverySettings
from autoplan.search.seeds import MAX_SEED
from autoplan.search.verify import QualityBudget, parse_budgets
from autoplan.streaming.runner import ExecutionSettings
from autoplan.workload import Workload

if TYPE_CHECKING:
    from autoplan.sensitivity.executor import Executor



@dataclass(frozen=True)
class CostTable:
    """Measured GEMM times replacing the analytic ones (`--cost-table FILE`)."""

    source: str  # the file it was read from, named in the plan
    document: dict[str, Any] = field(repr=False)

    @classmethod
    def load(cls, path: str) -> CostTable:
        """Read and validate the whole file (UserInputError naming the problem)."""
        return cls(str(path), load_cost_table(str(path)))


KV_AUTO = "auto"  # --kv-cache auto: every cache format the runtime serves on the target


def parse_kv_cache(texts: str | tuple | None) -> tuple[KvFormat, ...] | tuple[str] | None:
    """`--kv-cache`: None (the runtime's own cache), ``("auto",)`` or distinct formats."""
    if texts is None:
        return None
    items = [t.strip() for t in texts.split(",")] if isinstance(texts, str) else list(texts)
    if any(str(t).lower() == KV_AUTO for t in items):
        if len(items) > 1:
            raise UserInputError("--kv-cache auto already tries every format the runtime "
                                 "serves: give it alone, or list formats")
        return (KV_AUTO,)
    if not items or items == [""]:
        raise UserInputError("--kv-cache is empty: give auto, or formats such as fp8,q8_0")
    return tuple(dict.fromkeys(t if isinstance(t, KvFormat) else KvFormat.parse(t)
                               for t in items))


def at_least(flag: str, value: int, low: int) -> None:
    if value < low:
        raise UserInputError(f"--{flag} must be at least {low}, got {value}")


@dataclass(frozen=True)
class SearchRequest:
    """Everything `autoplan search` takes; defaults suit the embedded model on a laptop CPU.

    `sampler` and `storage` may be Optuna objects, as `optuna.create_study` takes them: a
    sampler given here samples every round (default: ExchangeSampler, or NSGA-II with
    `multi_objective`); a storage object holds the study (default: the URL in `storage`, or
    a journal file beside `out`). `executor` is where verification candidates will run
    (None: this process).
    """

    model: str = "smollm2-135m"
    target: str = "h100-sxm"
    runtime: str | None = None
    budget: QualityBudget = QualityBudget.parse("kl<=0.05")
    objective: Objective = Objective.THROUGHPUT
    workload: Workload = field(default_factory=lambda: Workload(batch=32, input_len=512,
                                                                output_len=128))
    trials: int = 2000
    seed: int = 0
    storage: str | BaseStorage | None = None
    study: str | None = None
    out: Path = Path("plan.json")
    multi_objective: bool = False
    settings: CompressionSettings = field(default_factory=CompressionSettings)
    text: str | None = None
    seq_len: int = 256
    calib_blocks: int = 4
    eval_blocks: int = 6
    protect_first_block: bool | None = None
    protect_last_block: bool | None = None
    verify_top: int = 2
    max_rounds: int = 6
    # The predicted gain a plan needs over a measured candidate of better quality to be
    # returned instead of it (0.05: 5 %). None: the speed prediction's stated uncertainty on
    # the target and runtime (search/preparation/_uncertainty.py).
    min_gain: float | None = None
    price_per_hour: float | None = None
    trust_remote_code: bool = False
    cost_table: CostTable | None = None
    # Time this machine's kernels (ONNX Runtime's, or ggml's for llama.cpp) for every
    # candidate and plan with them. None: yes exactly when planning for this machine
    # (--target local with --runtime onnxruntime or llama.cpp), where the analytic model is
    # 1.1-1.9x pessimistic (docs/lab/benchmarks.md, CPU section).
    measure_kernels: bool | None = None
    choices: tuple[Choice, ...] | None = None  # candidate formats (default: the space file's)
    execution: ExecutionSettings = field(default_factory=ExecutionSettings)
    sampler: BaseSampler | None = None
    executor: Executor | None = None
    # `--batch max` or a TTFT/TPOT SLO: the batch is resolved per target before the search
    # (autoplan/cost/operating.py) and replaces `workload`'s; None: `workload` as given.
    operating: OperatingRequest | None = None
    # further budgets a plan must also meet (a second --budget and later); `budget` steers
    also: tuple[QualityBudget, ...] = ()
    # --recover: finalists are measured after this recovery pass (None: not recovered)
    recovery: RecoverySettings | None = None
    lmeval_tasks: str | None = None  # --lm-eval-tasks: a folder of local lm-eval task YAML
    lmeval_limit: int | None = None  # --lm-eval-limit: documents per task
    # KL per slice (numbers, names, non-English) for the reported plan (for every
    # measurement when a budget names a slice: Verifier.slices_decide)
    slices: bool = True
    # --kv-cache: KV-cache formats searched with the weights, each at its own operating
    # point (None: the runtime's own cache only; ("auto",): every one it serves here)
    kv_cache: tuple[KvFormat, ...] | tuple[str] | None = None
    # --kv-cache FORMAT@BLOCKS,...: the per-block mix asked (block -> format), checked
    # against the engine in preflight (kv_cache then holds the one format it amounts to)
    kv_mix: dict[int, KvFormat] | None = None
    # with a compressed cache: the long-prompt split's block length (0: max(2048,
    # input + output) within the model's context) and blocks, and the long-context check
    # every such plan meets unless a --budget longctx... is given
    long_len: int = 0
    long_blocks: int = 2
    kv_gate: str = "longctx>=-5"

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if isinstance(self.budget, str):
            put("budget", QualityBudget.parse(self.budget))
        put("also", parse_budgets(self.also) if self.also else ())
        put("objective", Objective.parse(self.objective))
        put("choices", parse_choices(self.choices))
        if isinstance(self.kv_cache, str) and (mix := parse_kv_mix(self.kv_cache)) is not None:
            put("kv_mix", mix)
            put("kv_cache", tuple(dict.fromkeys(mix.values())))
        else:
            put("kv_cache", parse_kv_cache(self.kv_cache))
        at_least("long-blocks", self.long_blocks, 1)
        if self.long_len and self.long_len < 2:
            raise UserInputError(f"--long-len must be at least 2 tokens, got {self.long_len}")
        if self.kv_cache is not None and self.recovery is not None:
            raise UserInputError("--recover with --kv-cache is not supported yet: recover a "
                                 "weights-only plan (autoplan recover PLAN), or search the "
                                 "KV cache without --recover")
        if isinstance(self.cost_table, str | Path):
            put("cost_table", CostTable.load(str(self.cost_table)))
        put("out", Path(self.out))
        # the solvers' thread count is fixed at the search's start, so every measurement,
        # worker and later export of its plan computes the same bits (autoplan/numerics.py)
        put("settings", self.settings.pinned())
        at_least("trials", self.trials, 1)
        at_least("verify-top", self.verify_top, 1)
        at_least("max-rounds", self.max_rounds, 1)
        if not 0 <= self.seed <= MAX_SEED:
            raise UserInputError(f"--seed must be an integer from 0 to {MAX_SEED}, got {self.seed}")
        if self.price_per_hour is not None and not 0 <= self.price_per_hour < math.inf:
            raise UserInputError("--price-per-hour must be a finite number >= 0, got "
                                 f"{self.price_per_hour}")
        if self.min_gain is not None and not 0 <= self.min_gain < math.inf:
            raise UserInputError(f"--min-gain must be a finite number >= 0, got {self.min_gain}")
        if self.lmeval_limit is not None:
            at_least("lm-eval-limit", self.lmeval_limit, 1)
        if self.measure_kernels and self.cost_table is not None:
            raise UserInputError(MEASURE_OR_TABLE)

    @property
    def threads(self) -> int | None:
        return self.execution.threads

    @property
    def budgets(self) -> tuple[QualityBudget, ...]:
        return (self.budget, *self.also)


__all__ = ["KV_AUTO", "MAX_SEED", "CostTable", "ExecutionSettings", "SearchRequest",
           "at_least", "parse_choices", "parse_kv_cache"]
