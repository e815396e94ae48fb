"""Search quality: the search's plan beside a reference mix found with real measurements only.

For each platform (target, runtime) and KL budget, one prepared search (profile, kernel times
and cost model, shared), then two runs on fresh verifiers, each counting its own real
evaluations (a candidate both measure is measured once, on disk, and counted by both):

  reference  benchmarks/_reference_mix.py: the best acceptable uniform recipe A, then a
             bisection with real measurements along the units ordered by the profile's time
             saved per unit of damage, toward the next faster recipe and toward the fastest
  stronger   where the fastest uniform recipe passes (no B), the reference goes on: a
             bisection from it toward each unit's fastest choice, every step measured
             (elsewhere it is the reference); its evaluations include the reference's
  search     what `autoplan search` runs after preparing: run_rounds -> choose

The search runs twice: with min_gain 0 (`plan_min_gain_0`: every predicted gain counts, how
well it optimizes against the reference mix) and as `autoplan search` runs it (`plan`: the
answer under the noise rule, against the reference's own answer under the same rule,
`choose` on the reference's measurements). Each row: every side's objective (predicted by
the cost model), measured KL and real evaluations; `plan_over_reference_ratio` (min-gain-0
plan / reference mix, by the objective: above 1 the plan is faster), the same against the
stronger reference (`plan_over_strong_reference_ratio`) and the answers' ratio;
P4 (plan / best uniform recipe, the model as is included); the share of the budget used;
why each search stopped and why its plan holds what it holds; the goals of issue 30.

Usage:
  python benchmarks/search_quality.py [--model smollm2-135m] [--platform local:onnxruntime]
      [--platform local:llama.cpp] [--platform h100] [--budgets 0.02,0.05,0.1] [--batch 1]
      [--input-len 512] [--output-len 128] [--trials 2000] [--execution memory]
      [--out benchmarks/results/search_quality.json] [--append]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402
from _reference_mix import real_evaluations, reference_mix, stronger_reference  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
USE_GOAL = 0.7  # where a faster recipe fails, the plan uses at least this share of the budget
OBJECTIVE_GOAL = 0.98  # plan / reference
NOISE_RULE = "within the speed prediction's uncertainty"


def answer_uses_budget(plan: dict, limit: float) -> bool | str:
    """The answer uses the budget, or the noise rule decided it: in the choice (`why`) or in
    the rounds' stop (`stopped`: no candidate faster by more than the uncertainty)."""
    if any(NOISE_RULE in (plan.get(k) or "") for k in ("why", "stopped")):
        return "noise rule"
    return plan["badness"] >= USE_GOAL * limit


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--platform", action="append", default=None,
                    help="TARGET or TARGET:RUNTIME (repeat; default local:onnxruntime, "
                         "local:llama.cpp, h100)")
    ap.add_argument("--budgets", default="0.02,0.05,0.1", help="KL budgets, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--objective", default="throughput")
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=None, help="kernel-timing threads (local)")
    ap.add_argument("--execution", default="memory", choices=("auto", "memory", "stream"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "search_quality.json"))
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of --out measured for other platforms or budgets "
                         "(same model and workload), replacing those this run measures")
    return ap.parse_args(argv)


def _fresh(prep, budget):  # noqa: ANN001, ANN202 - Prepared in, Prepared out
    """`prep` for `budget` with no measurement made and a study storage of its own."""
    import optuna

    req = dataclasses.replace(prep.req, budget=budget)
    verifier = dataclasses.replace(prep.verifier, budget=budget, measured={})
    platform = dataclasses.replace(prep.platform, storage=optuna.storages.InMemoryStorage())
    return dataclasses.replace(prep, req=req, verifier=verifier, platform=platform)


def _side(prep, m, evaluations: int, seconds: float) -> dict:  # noqa: ANN001
    """One side's measured candidate."""
    return {"label": m.label, "objective": prep.value(m.picks), "kl": m.quality.kl,
            "badness": m.badness, "passed": m.passed, "real_evaluations": evaluations,
            "seconds": round(seconds, 1)}


def _over(prep, a: float, b: float) -> float:  # noqa: ANN001
    """How many times better objective `a` is than `b` (above 1: `a` is better)."""
    return a / b if prep.sign < 0 else b / a


def _search(prep, budget, rep, min_gain: float | None) -> tuple:  # noqa: ANN001
    """(prepared copy, rounds, chosen, seconds) of what `autoplan search` runs after
    preparing, on a fresh verifier (`min_gain` None: the platform's stated uncertainty)."""
    from autoplan.search import choose, run_rounds

    fresh = _fresh(prep, budget)
    if min_gain is not None:
        fresh = dataclasses.replace(fresh, req=dataclasses.replace(fresh.req, min_gain=min_gain))
    t0 = time.perf_counter()
    rounds = run_rounds(fresh, rep)
    chosen = choose(fresh, rounds, rep)
    return fresh, rounds, chosen, time.perf_counter() - t0


def _plan(prep, rounds, chosen, seconds: float) -> dict:  # noqa: ANN001
    m = chosen.measurement
    return _side(prep, m, real_evaluations(prep), seconds) | {
        "outcome": chosen.outcome.value, "why": chosen.why, "stopped": rounds.stopped,
        "rounds": [r.model_dump(mode="json", include={"round", "surrogate_limit", "aim",
                                                      "calibration", "verified"})
                   for r in rounds.log],
        "decisions": _counts(prep, m.picks)}


def _row(prep, budget, rep) -> dict:  # noqa: ANN001
    """One row: the reference, the search (its stated uncertainty: the answer a user gets)
    and the search with min_gain 0 (every predicted gain counts: how well it optimizes)."""
    from autoplan.search import Rounds, choose

    ref_prep = _fresh(prep, budget)
    t0 = time.perf_counter()
    ref = reference_mix(ref_prep, rep)
    ref_s = time.perf_counter() - t0
    answer = choose(ref_prep, Rounds(0.0, None, None, 0), rep)  # the same noise rule
    ref_evals = real_evaluations(ref_prep)
    strong = stronger_reference(ref_prep, rep, ref)  # after: the answer is the issue's
    strong_s = time.perf_counter() - t0
    plans = {"plan": _search(prep, budget, rep, None),
             "plan_min_gain_0": _search(prep, budget, rep, 0.0)}
    search, _, chosen, _ = plans["plan"]
    loose, _, loose_chosen, _ = plans["plan_min_gain_0"]
    uniform = chosen.best_uniform
    m = chosen.measurement
    plan_obj, loose_obj = search.value(m.picks), loose.value(loose_chosen.measurement.picks)
    answer_obj = ref_prep.value(answer.measurement.picks)
    faster_fails = ref.faster is not None  # some uniform recipe faster than A fails
    mix_beats_a = ref.label != ref.uniform  # a mix faster than A passes
    row = {
        "target": prep.platform.target.name, "runtime": prep.platform.runtime,
        "budget": budget.text, "limit": budget.limit,
        "speed_uncertainty": search.uncertainty.to_json(),
        "reference": _side(ref_prep, ref_prep.verifier.measured[ref.picks], ref_evals,
                           ref_s) | {"label": ref.label, "uniform_a": ref.uniform,
                                     "faster_b": ref.faster, "bisection": ref.steps},
        "reference_answer": _side(ref_prep, answer.measurement, ref_evals, ref_s) | {
            "why": answer.why},
        "reference_strong": _side(ref_prep, ref_prep.verifier.measured[strong.picks],
                                  strong.evaluations, strong_s) | {
            "label": strong.label, "toward": strong.faster, "extended": strong.extended,
            "bisection": strong.steps if strong.extended else []},
        **{k: _plan(*v) for k, v in plans.items()},
        # the best acceptable uniform recipe (or the model as is), every recipe tried (the
        # reference's A); the search's own, among the six fastest, beside it
        "best_uniform": {"label": ref.uniform, "objective": ref_prep.value(ref.uniform_picks),
                         "kl": ref_prep.verifier.measured[ref.uniform_picks].quality.kl},
        "search_best_uniform": None if uniform is None else uniform.label,
        # the search that spends every predicted gain against the reference mix; the
        # search's answer (noise rule) against the reference's answer under the same rule
        "plan_over_reference_ratio": _over(search, loose_obj, ref.objective),
        "plan_over_strong_reference_ratio": _over(search, loose_obj, strong.objective),
        "answer_over_reference_answer_ratio": _over(search, plan_obj, answer_obj),
        "answer_over_reference_mix_ratio": _over(search, plan_obj, ref.objective),
        "p4_plan_over_best_uniform": _over(search, loose_obj, search.value(ref.uniform_picks)),
        "p4_answer_over_best_uniform": _over(search, plan_obj, search.value(ref.uniform_picks)),
        "budget_used": loose_chosen.measurement.badness / budget.limit,
        "answer_budget_used": m.badness / budget.limit,
    }
    row["goals"] = {
        "objective_vs_reference": row["plan_over_reference_ratio"] >= OBJECTIVE_GOAL,
        "evaluations": real_evaluations(loose) <= ref_evals,
        # the same two against the stronger reference (the where a faster recipe fails)
        "objective_vs_strong_reference":
            row["plan_over_strong_reference_ratio"] >= OBJECTIVE_GOAL,
        "evaluations_vs_strong_reference": real_evaluations(loose) <= strong.evaluations,
        "answer_vs_reference_answer":
            row["answer_over_reference_answer_ratio"] >= OBJECTIVE_GOAL,
        "answer_evaluations": real_evaluations(search) <= ref_evals,
        # where a faster recipe fails and the reference finds a faster mix that passes
        "uses_budget": None if not (faster_fails and mix_beats_a) else
        loose_chosen.measurement.badness >= USE_GOAL * budget.limit,
        "answer_uses_budget": None if not (faster_fails and mix_beats_a) else
        answer_uses_budget(row["plan"], budget.limit),
    }
    return row


def _counts(prep, picks) -> dict[str, int]:  # noqa: ANN001
    from collections import Counter

    return dict(Counter(str(c) for c in prep.tables.choices_of(picks).values()))


def _platforms(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    items = args.platform or ["local:onnxruntime", "local:llama.cpp", "h100"]
    return [(p.split(":", 1)[0], p.split(":", 1)[1] if ":" in p else None) for p in items]


def _kept(doc: dict, out: Path, platforms: list, budgets: list) -> dict:
    """`doc` with the rows of the earlier run in `out` that this run does not measure again,
    each earlier command kept beside this one (`--append`)."""
    import json

    old = json.loads(out.read_text())
    if (old.get("model"), old.get("workload")) != (doc["model"], doc["workload"]):
        raise SystemExit(f"{out} holds another model or workload: use another --out")
    texts = {b.text for b in budgets}

    def again(row: dict) -> bool:
        return row["budget"] in texts and any(
            row["target"].startswith(t) or (t == "local" and row["target"] == "local")
            for t, rt in platforms if rt in (None, row["runtime"]))

    commands = old.get("commands", [old["command"]])
    return doc | {"rows": [r for r in old["rows"] if not again(r)],
                  "load_avg_1m": old.get("load_avg_1m", []),
                  "commands": [*commands, doc["command"]]}


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    import optuna
    import torch

    from autoplan.search import (
        ExecutionSettings,
        QualityBudget,
        Reporter,
        SearchRequest,
        preflight,
        prepare,
    )
    from autoplan.workload import Workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    budgets = [QualityBudget.parse(f"kl<={b}") for b in args.budgets.split(",")]
    rep = Reporter()
    rows, out = [], Path(args.out)
    doc = {"benchmark": "search_quality", "command": command, "machine": info,
           "model": args.model, "workload": {"batch": args.batch, "input_len": args.input_len,
                                             "output_len": args.output_len},
           "objective": args.objective, "trials": args.trials, "rows": rows,
           "load_avg_1m": []}
    if args.append and out.exists():
        doc = _kept(doc, out, _platforms(args), budgets)
        rows = doc["rows"]
    with tempfile.TemporaryDirectory() as tmp:
        for target, runtime in _platforms(args):
            req = SearchRequest(
                model=args.model, target=target, runtime=runtime, budget=budgets[0],
                objective=args.objective, trials=args.trials, seed=args.seed,
                workload=Workload(batch=args.batch, input_len=args.input_len,
                                  output_len=args.output_len),
                storage=optuna.storages.InMemoryStorage(), out=Path(tmp) / "plan.json",
                execution=ExecutionSettings(execution=args.execution, threads=args.threads))
            prep = prepare(req, preflight(req), rep)
            for budget in budgets:
                doc["load_avg_1m"].append(round(os.getloadavg()[0], 2))
                row = _row(prep, budget, rep)
                rows.append(row)
                loose, plan, ref = row["plan_min_gain_0"], row["plan"], row["reference"]
                print(f"{row['target']}/{row['runtime']} {budget.text}: reference "
                      f"{ref['label']} KL {ref['kl']:.4f} ({ref['real_evaluations']} evals); "
                      f"search (min gain 0) {loose['label']} KL {loose['kl']:.4f} "
                      f"({loose['real_evaluations']} evals), x reference "
                      f"{row['plan_over_reference_ratio']:.4f}; stronger reference "
                      f"{row['reference_strong']['label']} KL "
                      f"{row['reference_strong']['kl']:.4f} "
                      f"({row['reference_strong']['real_evaluations']} evals), x stronger "
                      f"{row['plan_over_strong_reference_ratio']:.4f}; answer {plan['label']} "
                      f"({plan['outcome']}) KL {plan['kl']:.4f}", flush=True)
                write_result(out, doc)  # after every row: a long run keeps what it measured
    write_result(out, doc)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
