"""Search quality: the search's plan beside a reference mix found with real measurements only.

For each platform (target, runtime) and KL budget, one prepared search (profile, kernel times
and cost model, shared), then two runs on fresh verifiers, each counting its own real
evaluations (a candidate both measure is measured once, on disk, and counted by both):

  reference  benchmarks/_reference_mix.py: the best acceptable uniform recipe A, then a
             bisection with real measurements along the units ordered by the profile's time
             saved per unit of damage, toward the next faster recipe and toward the fastest
  search     what `autoplan search` runs after preparing: run_rounds -> choose

Each row: both sides' objective (predicted by the cost model), measured KL and real
evaluations; `plan_over_reference_ratio` (plan / reference mix, by the objective: above 1 the
plan is faster); the reference's own answer under the search's noise rule (`choose` on its
measurements) and the plan over it; P4 (plan / best uniform recipe, the model as is
included); the share of the budget the plan uses; why the search stopped and why the plan
holds what it holds; the goals of issue 30 checked.

Usage:
  python benchmarks/search_quality.py [--model smollm2-135m] [--platform local:onnxruntime]
      [--platform local:llama.cpp] [--platform h100] [--budgets 0.02,0.05,0.1] [--batch 1]
      [--input-len 512] [--output-len 128] [--trials 2000] [--execution memory]
      [--out benchmarks/results/search_quality.json]
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
from _reference_mix import real_evaluations, reference_mix  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
USE_GOAL = 0.7  # where a faster recipe fails, the plan uses at least this share of the budget
OBJECTIVE_GOAL = 0.98  # plan / reference


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
    return ap.parse_args(argv)


def _fresh(prep, budget):  # noqa: ANN001, ANN202 - Prepared in, Prepared out
    """`prep` for `budget` with no measurement made and a study storage of its own."""
    import optuna

    req = dataclasses.replace(prep.req, budget=budget)
    verifier = dataclasses.replace(prep.verifier, budget=budget, measured={})
    platform = dataclasses.replace(prep.platform, storage=optuna.storages.InMemoryStorage())
    return dataclasses.replace(prep, req=req, verifier=verifier, platform=platform)


def _side(prep, m, evaluations: int, seconds: float) -> dict:  # noqa: ANN001
    return {"label": m.label, "objective": prep.value(m.picks), "kl": m.quality.kl,
            "badness": m.badness, "passed": m.passed, "real_evaluations": evaluations,
            "seconds": round(seconds, 1)}


def _over(prep, a: float, b: float) -> float:  # noqa: ANN001
    """How many times better objective `a` is than `b` (above 1: `a` is better)."""
    return a / b if prep.sign < 0 else b / a


def _row(prep, budget, rep) -> dict:  # noqa: ANN001
    from autoplan.search import Rounds, choose, run_rounds

    ref_prep = _fresh(prep, budget)
    t0 = time.perf_counter()
    ref = reference_mix(ref_prep, rep)
    ref_s = time.perf_counter() - t0
    answer = choose(ref_prep, Rounds(0.0, None, None, 0), rep)  # the same noise rule
    ref_evals = real_evaluations(ref_prep)

    search = _fresh(prep, budget)
    t0 = time.perf_counter()
    rounds = run_rounds(search, rep)
    chosen = choose(search, rounds, rep)
    plan_s = time.perf_counter() - t0
    plan_evals = real_evaluations(search)
    m = chosen.measurement
    uniform = chosen.best_uniform
    plan_obj = search.value(m.picks)
    ref_mix = ref_prep.verifier.measured[ref.picks]
    faster_fails = ref.faster is not None  # some uniform recipe faster than A fails
    mix_beats_a = ref.label != ref.uniform  # a mix faster than A passes
    row = {
        "target": prep.platform.target.name, "runtime": prep.platform.runtime,
        "budget": budget.text, "limit": budget.limit,
        "speed_uncertainty": search.uncertainty.to_json(),
        "reference": _side(ref_prep, ref_mix, ref_evals, ref_s) | {
            "label": ref.label, "uniform_a": ref.uniform, "faster_b": ref.faster,
            "bisection": ref.steps},
        "reference_answer": _side(ref_prep, answer.measurement, ref_evals, ref_s) | {
            "why": answer.why},
        "plan": _side(search, m, plan_evals, plan_s) | {
            "outcome": chosen.outcome.value, "why": chosen.why, "stopped": rounds.stopped,
            "rounds": [{k: r[k] for k in ("round", "surrogate_limit", "aim", "calibration",
                                          "verified")} for r in rounds.log],
            "decisions": _counts(search, m.picks)},
        "best_uniform": None if uniform is None else {
            "label": uniform.label, "objective": search.value(uniform.picks),
            "kl": uniform.quality.kl},
        "plan_over_reference_ratio": _over(search, plan_obj, ref.objective),
        "plan_over_reference_answer_ratio": _over(search, plan_obj,
                                                  ref_prep.value(answer.measurement.picks)),
        "p4_plan_over_best_uniform": None if uniform is None else
        _over(search, plan_obj, search.value(uniform.picks)),
        "budget_used": m.badness / budget.limit,
    }
    noise = "within the speed prediction's uncertainty" in chosen.why
    row["goals"] = {
        "objective_vs_reference": row["plan_over_reference_ratio"] >= OBJECTIVE_GOAL,
        "objective_vs_reference_answer":
            row["plan_over_reference_answer_ratio"] >= OBJECTIVE_GOAL,
        "evaluations": plan_evals <= ref_evals,
        # where a faster recipe fails and the reference finds a faster mix that passes
        "uses_budget": None if not (faster_fails and mix_beats_a) else
        ("noise rule" if noise else m.badness >= USE_GOAL * budget.limit),
    }
    return row


def _counts(prep, picks) -> dict[str, int]:  # noqa: ANN001
    from collections import Counter

    return dict(Counter(str(c) for c in prep.tables.choices_of(picks).values()))


def _platforms(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    items = args.platform or ["local:onnxruntime", "local:llama.cpp", "h100"]
    return [(p.split(":", 1)[0], p.split(":", 1)[1] if ":" in p else None) for p in items]


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
                print(f"{row['target']}/{row['runtime']} {budget.text}: plan "
                      f"{row['plan']['label']} ({row['plan']['outcome']}) KL "
                      f"{row['plan']['kl']:.4f}, {row['plan']['real_evaluations']} evals; "
                      f"reference {row['reference']['label']} KL {row['reference']['kl']:.4f}, "
                      f"{row['reference']['real_evaluations']} evals; plan/reference "
                      f"{row['plan_over_reference_ratio']:.4f}, P4 "
                      f"{row['p4_plan_over_best_uniform'] or float('nan'):.4f}", flush=True)
                write_result(out, doc)  # after every row: a long run keeps what it measured
    write_result(out, doc)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
