"""`autoplan compare`: one model, one budget, several (target, runtime) pairs, one table.

    preflight every entry (arguments, files, operating point)  -- before any work
    load the model once -> one decision space per entry -> ONE sensitivity profile over
    the union of their layers and choices -> the original measured once
    per entry: prepare_platform -> run_rounds -> choose -> certify -> build_plan -> save
    (verifications shared: identical decisions are measured once, `SharedMeasurements`)
    -> rows sorted by the objective -> compare.json

A target whose memory cannot hold the uncompressed model at the asked batch (or at batch 1
for `--batch max` / an SLO) is a row `does not fit` with the bytes, not a dropped entry; a
target whose batch-1 latency already misses the SLO is a row `no operating point`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from autoplan.atomic import check_writable_dir, write_json_atomic
from autoplan.compare.request import CompareEntry, CompareRequest
from autoplan.cost.operating import NoOperatingPoint
from autoplan.cost.report import DIRECTION
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.plan import schema as ps
from autoplan.plan.io import save_plan
from autoplan.runtimes import supports
from autoplan.search import (
    Platform,
    SearchRequest,
    build_plan,
    certify,
    choose,
    preflight,
    run_rounds,
)
from autoplan.search.reporter import Reporter
from autoplan.search.stages import (
    CALIB_BATCH, model_work, open_model_work, platform_space, prepare_platform, profile_spaces
)

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


class _Prefixed(Reporter):
    """Stages and notes of one entry, prefixed with its name."""

    def __init__(self, inner: Reporter, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def stage(self, name: str) -> None:
        self.inner.stage(f"{self.prefix}: {name}")

    def progress(self, task: str, done: int, total: int) -> None:
        self.inner.progress(task, done, total)

    def note(self, text: str) -> None:
        self.inner.note(f"{self.prefix}: {text}")


def _row_of(entry: CompareEntry, plan: ps.Plan, platform: Platform, dropped: dict[str, str],
            wall_s: float, file: str) -> Row:
    pred = plan.predicted
    counts: dict[str, int] = {}
    for c in plan.decisions.values():
        counts[c] = counts.get(c, 0) + 1
    gain = None  # over a baseline that cannot run there: none
    if pred["baseline"].fits and pred["baseline"].tokens_per_s > 0:
        gain = pred["plan"].tokens_per_s / pred["baseline"].tokens_per_s
    return Row(entry.target, entry.runtime, "ok", plan_file=file, batch=plan.workload["batch"],
               operating_point=platform.point.detail if platform.point else
               f"batch {plan.workload['batch']} (as given)",
               plan=pred["plan"].model_dump(), baseline=pred["baseline"].model_dump(),
               best_uniform=pred["best_uniform"].model_dump() if "best_uniform" in pred else None,
               kl=plan.quality.kl, budget_met=plan.quality.budget_met,
               outcome=plan.search.outcome, gain_over_baseline=gain,
               gain_over_best_uniform=plan.search.gain_over_best_uniform,
               best_uniform_name=plan.search.best_uniform,
               decisions=dict(sorted(counts.items(), key=lambda kv: -kv[1])),
               not_accelerated=dropped, wall_s=wall_s,
               real_evaluations=plan.search.real_evaluations)


def _sorted(rows: list[Row], objective: str) -> tuple[Row, ...]:
    sign = -1.0 if DIRECTION[objective] == "maximize" else 1.0  # type: ignore[index]
    ok = [r for r in rows if r.status == "ok"]
    rest = [r for r in rows if r.status != "ok"]
    return tuple(sorted(ok, key=lambda r: sign * (r.objective_value(objective) or 0.0)) + rest)


def run_compare(req: CompareRequest, reporter: Reporter | None = None) -> Comparison:
    """Search every entry on one shared profile and write the plans and compare.json.

    Raises:
        UserInputError: bad input, refused before the model is loaded.
    """
    rep = reporter or Reporter()
    t0 = time.perf_counter()
    check_writable_dir(req.out_dir)
    if req.out_dir.is_file():
        raise UserInputError(f"--out '{req.out_dir}' is a file: compare writes a folder of plans")
    subs = [(e, req.search_request(e)) for e in req.entries]
    rows: list[Row] = []
    live: list[tuple[CompareEntry, SearchRequest, Platform]] = []
    for entry, sub in subs:  # every entry checked before the model is loaded
        try:  # a baseline that does not fit leaves the formats that do (Platform.unfit)
            platform, unfit = preflight(sub), None
        except NoOperatingPoint as exc:
            platform, unfit = None, exc
        if unfit is not None:
            status = "does not fit" if unfit.needed_bytes is not None else "no operating point"
            rows.append(Row(entry.target, entry.runtime, status, reason=str(unfit),
                            needed_bytes=unfit.needed_bytes, usable_bytes=unfit.usable_bytes))
            continue
        live.append((entry, sub, platform))  # type: ignore[arg-type]
    req.out_dir.mkdir(parents=True, exist_ok=True)  # only once every entry passed its checks
    measurements = reused = cached = entries_scored = 0
    profile_s = 0.0
    if live:
        base = live[0][1]
        runner, data = open_model_work(base, rep, any(p.measure_kernels for _, _, p in live))
        spaces = [platform_space(sub, p, runner.loaded) for _, sub, p in live]
        calib = list(data.calib.split(CALIB_BATCH))
        t_profile = time.perf_counter()
        profile = profile_spaces(base, runner, calib, spaces, rep)
        profile_s = time.perf_counter() - t_profile
        entries_scored = sum(len(v) for v in profile.scores.values())
        work = model_work(base, runner, data, rep)
        # every format any entry considered: what each runtime refuses of it is a column
        considered = list(dict.fromkeys(
            [str(c) for sp in spaces for c in sp.all_choices]
            + [c for sp in spaces for c in sp.dropped]))
        for (entry, sub, platform), space in zip(live, spaces, strict=True):
            t_entry = time.perf_counter()
            sub_rep = _Prefixed(rep, entry.name)
            if platform.unfit is not None:
                sub_rep.note(platform.unfit.describe(platform.target.name))
            prep = prepare_platform(sub, platform, work, space, profile, sub_rep)
            rounds = run_rounds(prep, sub_rep)
            chosen = choose(prep, rounds, sub_rep)
            certificate = certify(prep, rounds, sub_rep)
            wall = time.perf_counter() - t_entry
            plan = build_plan(prep, rounds, chosen, certificate, wall)
            save_plan(plan, sub.out)
            refused = {c: r for c in considered
                       if not (r := supports(platform.target, platform.runtime,
                                             Choice.parse(c))).ok}
            rows.append(_row_of(entry, plan, platform,
                                {c: ans.reason for c, ans in refused.items()}, wall,
                                sub.out.name))
        reused, cached = work.shared.reused, work.shared.cached
        measurements = work.shared.measured
    comparison = Comparison(
        _sorted(rows, req.base.objective.value), req.base.objective.value, req.base.model,
        req.base.budget.text, time.perf_counter() - t0, profile_s, entries_scored,
        measurements, reused, str(req.out_dir), cached)
    write_json_atomic(req.out_dir / RESULT_FILE, comparison.to_json())
    return comparison


__all__ = ["RESULT_FILE", "Comparison", "Row", "run_compare"]
