"""`autoplan search` on the MoEfied SmolLM2 (benchmarks/moefy.py): a verified plan for a GPU
target from a real-weight mixture-of-experts model, on this CPU (quality is measured, speed
is predicted by the cost model with the calibration routing the profile recorded).

Records the plan's outcome and measured KL, its decisions by part (attention / routed
experts / lm_head), the routing shares the cost model used (hot vs cold experts), the
expected distinct experts a decode step touches at the plan's batch, and the predicted
speeds of the plan, the baseline and the best uniform recipe.

    python benchmarks/moe_search.py [--model FOLDER] [--target h100] [--budget 'kl<=0.05']
        -> benchmarks/results/moe_search_h100.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="the MoEfied folder (default: $AUTOPLAN_CACHE/models/smollm2-135m-moe-e8k6)")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--runtime", default=None)
    ap.add_argument("--budget", default="kl<=0.05")
    ap.add_argument("--batch", default="8")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    info, command = start_run(0, argv)

    from autoplan.cost.moe import Routing
    from autoplan.models._cache import models_dir
    from autoplan.modelspec import ModelSpec, part_of
    from autoplan.search import SearchRequest, run_search
    from autoplan.workload import Workload

    model = Path(args.model) if args.model else models_dir() / "smollm2-135m-moe-e8k6"
    out = Path(args.out or f"benchmarks/results/moe_search_{args.target}.json")
    plan_path = out.with_name(out.stem + "_plan.json")
    req = SearchRequest(model=str(model), target=args.target, runtime=args.runtime,
                        budget=args.budget, workload=Workload(batch=int(args.batch),
                                                              input_len=512, output_len=128),
                        trials=args.trials, out=plan_path)
    t0 = time.perf_counter()
    result = run_search(req)
    wall = time.perf_counter() - t0
    plan = result.plan
    spec = ModelSpec.from_path(model)
    routing = Routing.from_json(spec, plan.routing)
    batch = plan.workload.batch
    shares = {b: sorted(s) for b, s in routing.shares.items()}
    by_part = Counter((part_of(n), c) for n, c in plan.decisions.items())
    doc = {
        "machine": info, "command": command, "model": str(model), "target": plan.target.name,
        "runtime": plan.runtime.name, "budget": plan.budget.text, "wall_s": wall,
        "outcome": plan.search.outcome, "measured_kl": plan.quality.kl,
        "budget_met": plan.quality.budget_met, "real_evaluations": plan.search.real_evaluations,
        "decisions_by_part": {f"{p} {c}": n for (p, c), n in sorted(by_part.items())},
        "routing_source": routing.source,
        "routing_share_range": {b: [s[0], s[-1]] for b, s in shares.items()},
        "expected_distinct_experts_at_batch": {
            b: routing.expected_distinct(b, batch) for b in routing.shares},
        "uniform_distinct_experts_at_batch": spec.moe.n_experts * (
            1 - (1 - spec.moe.top_k / spec.moe.n_experts) ** batch),
        "predicted": {k: v.model_dump() for k, v in plan.predicted.items()},
        "gain_over_best_uniform": plan.search.gain_over_best_uniform,
        "best_uniform": plan.search.best_uniform,
        "plan_file": str(plan_path),
    }
    write_result(out, doc)
    print(f"{plan.search.outcome}: KL {plan.quality.kl:.4f} ({plan.budget.text}, "
          f"{'met' if plan.quality.budget_met else 'NOT met'}), {wall:.0f} s; "
          f"tokens/s plan {plan.predicted['plan'].tokens_per_s:,.0f} vs baseline "
          f"{plan.predicted['baseline'].tokens_per_s:,.0f} (predicted)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
