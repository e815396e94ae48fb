"""`autoplan compare`: one model, one budget, several (target, runtime) pairs, one table.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.atomic import check_writable_dir, write_json_atomic
from autoplan.compare.request import CompareRequest
from autoplan.cost.report import DIRECTION
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.runtimes import supports
from autoplan.search import Pipeline, Searched, SearchSpace, Skipped
from autoplan.search.reporter import Reporter

RESULT_FILE = "compare.json"
# The Predicted field each objective ranks by (plan.predicted["plan"]).
_OBJECTIVE_FIELD = {"throughput": "tokens_per_s", "cost": "usd_per_1m_tokens",
                    "energy": "energy_j_per_token", "latency": "request_latency_s",
                    "tpot": "tpot_s"}


@dataclass(frozen=True)
class Row:
    """One entry of the comparison (speed figures are cost-model predictions; KL measured)."""

    target: str
    runtime: str
    status: str  # "ok" | "does not fit" | "no operating point"
    reason: str = ""
    plan_file: str | None = None
    batch: int | None = None
    operating_point: str = ""
    plan: dict[str, Any] | None = None  # Predicted of the plan
    baseline: dict[str, Any] | None = None
    best_uniform: dict[str, Any] | None = None
    kl: float | None = None  # measured
    budget_met: bool | None = None
    outcome: str | None = None
    gain_over_baseline: float | None = None
    gain_over_best_uniform: float | None = None
    best_uniform_name: str | None = None
    decisions: dict[str, int] = field(default_factory=dict)  # choice -> layers
    not_accelerated: dict[str, str] = field(default_factory=dict)  # choice -> reason
    needed_bytes: float | None = None  # does not fit: what batch 1 (or the batch) needs
    usable_bytes: float | None = None
    wall_s: float = 0.0
    real_evaluations: int = 0

    def objective_value(self, objective: str) -> float | None:
        return self.plan[_OBJECTIVE_FIELD[objective]] if self.plan else None


@dataclass(frozen=True)
class Comparison:
    """The table and how it was made."""

    rows: tuple[Row, ...]
    objective: str
    model: str
    budget: str
    wall_s: float
    profile_s: float
    profile_entries: int  # layer x choice scores in the one profile
    measurements: int  # real-model verifications run
    reused: int  # verifications answered from another entry's identical decisions
    out_dir: str
    cached: int = 0  # verifications answered from an earlier run's (measurement_cache)

    def to_json(self) -> dict[str, Any]:
        return {"predicted_speed": True, "objective": self.objective, "model": self.model,
                "budget": self.budget, "wall_s": self.wall_s, "profile_s": self.profile_s,
                "profile_entries": self.profile_entries, "measurements": self.measurements,
                "reused_measurements": self.reused, "cached_measurements": self.cached,
                "rows": [asdict(r) for r in self.rows]}


def _row_of(result: Searched | Skipped, considered: list[str]) -> Row:
    req = result.req
    if isinstance(result, Skipped):
        unfit = result.reason
        status = "does not fit" if unfit.needed_bytes is not None else "no operating point"
        return Row(req.target, req.runtime, status, reason=str(unfit),
                   needed_bytes=unfit.needed_bytes, usable_bytes=unfit.usable_bytes)
    plan, platform = result.plan, result.platform
    pred = plan.predicted
    counts: dict[str, int] = {}
    for c in plan.decisions.values():
        counts[c] = counts.get(c, 0) + 1
    gain = None  # over a baseline that cannot run there: none
    if pred["baseline"].fits and pred["baseline"].tokens_per_s > 0:
        gain = pred["plan"].tokens_per_s / pred["baseline"].tokens_per_s
    # every format any entry considered: what this runtime refuses of it is a column
    refused = {c: r.reason for c in considered
               if not (r := supports(platform.target, platform.runtime, Choice.parse(c))).ok}
    return Row(req.target, req.runtime, "ok", plan_file=req.out.name, batch=plan.workload.batch,
               operating_point=platform.point.detail if platform.point else
               f"batch {plan.workload.batch} (as given)",
               plan=pred["plan"].model_dump(), baseline=pred["baseline"].model_dump(),
               best_uniform=pred["best_uniform"].model_dump() if "best_uniform" in pred else None,
               kl=plan.quality.kl, budget_met=plan.quality.budget_met,
               outcome=plan.search.outcome, gain_over_baseline=gain,
               gain_over_best_uniform=plan.search.gain_over_best_uniform,
               best_uniform_name=plan.search.best_uniform,
               decisions=dict(sorted(counts.items(), key=lambda kv: -kv[1])),
               not_accelerated=refused, wall_s=result.wall_s,
               real_evaluations=plan.search.real_evaluations)


def _considered(spaces: tuple[SearchSpace, ...]) -> list[str]:
    return list(dict.fromkeys([str(c) for sp in spaces for c in sp.all_choices]
                              + [c for sp in spaces for c in sp.dropped]))


def _sorted(rows: list[Row], objective: str) -> tuple[Row, ...]:
    sign = -1.0 if DIRECTION[objective] == "maximize" else 1.0  # type: ignore[index]
    ok = [r for r in rows if r.status == "ok"]
    rest = [r for r in rows if r.status != "ok"]
    return tuple(sorted(ok, key=lambda r: sign * (r.objective_value(objective) or 0.0)) + rest)


def run_compare(req: CompareRequest, reporter: Reporter | None = None) -> Comparison:
    """Search every entry on one shared profile and write the plans and compare.json (the
    search's pipeline: each entry's study in its job queue, `--recover` as in a search).

    Raises:
        UserInputError: bad input, refused before the model is loaded.
    """
    t0 = time.perf_counter()
    check_writable_dir(req.out_dir)
    if req.out_dir.is_file():
        raise UserInputError(f"--out '{req.out_dir}' is a file: compare writes a folder of plans")
    pipeline = Pipeline([req.search_request(e) for e in req.entries], reporter,
                        skip_unfit=True, prefix=True)
    rows = [_row_of(result, _considered(pipeline.shared.spaces) if pipeline.shared else [])
            for result in pipeline.run()]
    shared = pipeline.shared
    measured = shared.work.shared if shared else None
    comparison = Comparison(
        _sorted(rows, req.base.objective.value), req.base.objective.value, req.base.model,
        req.base.budget.text, time.perf_counter() - t0, shared.profile_s if shared else 0.0,
        sum(len(v) for v in shared.profile.scores.values()) if shared else 0,
        measured.measured if measured else 0, measured.reused if measured else 0,
        str(req.out_dir), measured.cached if measured else 0)
    write_json_atomic(req.out_dir / RESULT_FILE, comparison.to_json())
    return comparison


__all__ = ["RESULT_FILE", "Comparison", "Row", "run_compare"]
