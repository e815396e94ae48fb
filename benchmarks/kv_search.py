"""A search with KV-cache choices on the embedded model at `--batch max --input-len 2048`:
does the plan verify within its budget, the long-context check included, and what KL does
the compressed cache cost on short and on long prompts.

Runs `autoplan search` through its library API (run_search) with `--kv-cache` formats
searched with the weights, each at its own operating point; a compressed cache is measured
on the short evaluation split and on the long-prompt split (blocks of max(2048, input +
output) tokens) and must pass the long-context check (`longctx>=-5`). Records each cache
tried (batch, objective, KL short and long, pass), the plan's quality and gates, its
predicted gain over the baseline, its deploy command and the wall time. Speeds are
predicted (the cost model); qualities measured here.

    python benchmarks/kv_search.py [--target h100] [--runtime vllm] [--kv-cache fp8]
        [--input-len 2048] [--output-len 256] [--budget kl<=0.05] [--trials 500]
        [--out benchmarks/results/kv_search.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="h100")
    p.add_argument("--runtime", default="vllm")
    p.add_argument("--kv-cache", default="fp8", help="formats searched (or auto)")
    p.add_argument("--input-len", type=int, default=2048)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--budget", default="kl<=0.05")
    p.add_argument("--trials", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/kv_search.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    from autoplan.cost.operating import OperatingRequest
    from autoplan.errors import AutoplanError
    from autoplan.search import SearchRequest, run_search
    from autoplan.search.verify import QualityBudget
    from autoplan.workload import Workload

    operating = OperatingRequest("max", input_len=args.input_len, output_len=args.output_len)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            req = SearchRequest(
                target=args.target, runtime=args.runtime,
                budget=QualityBudget.parse(args.budget), trials=args.trials, seed=args.seed,
                out=Path(tmp) / "plan.json", operating=operating, kv_cache=args.kv_cache,
                workload=Workload(batch=1, input_len=args.input_len,
                                  output_len=args.output_len))
            t0 = time.perf_counter()
            plan = run_search(req).plan
            wall = time.perf_counter() - t0
        except AutoplanError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
    kv, q = plan.kv_cache, plan.quality
    assert kv is not None  # --kv-cache always records the cache
    tried = [a.model_dump(mode="json") for a in kv.alternatives]
    gates = {name: g.model_dump(mode="json") for name, g in q.gates.items()}
    doc = {
        "what": "autoplan search with KV-cache choices on the embedded model "
                "(qualities MEASURED, speeds PREDICTED by the cost model)",
        "machine": info, "command": command, "wall_s": round(wall, 1),
        "request": {"target": args.target, "runtime": args.runtime, "kv_cache": args.kv_cache,
                    "batch": "max", "input_len": args.input_len, "output_len": args.output_len,
                    "budget": args.budget, "trials": args.trials},
        "plan": {"kv_cache": kv.format, "flag": kv.flag, "scales": kv.scales,
                 "batch": plan.workload.batch, "long_split_tokens": kv.long_split_tokens,
                 "kl_short": q.kl, "kl_long": q.kl_long, "ppl": q.ppl, "ppl_ref": q.ppl_ref,
                 "budget_met": q.budget_met, "gates": gates,
                 "deploy": plan.deploy.shell if plan.deploy else None},
        "kv_tried": tried,
        "predicted": {k: v.model_dump(mode="json") for k, v in plan.predicted.items()},
        "plan_json": plan.model_dump(mode="json"),
    }
    write_result(args.out, doc)
    print(f"plan: KV {kv.format} at batch {plan.workload.batch}; KL short {q.kl:.4f}, long "
          f"{q.kl_long}; budget met {q.budget_met}; gates {gates}; wall {wall:.0f} s; "
          f"wrote {args.out}")
    for a in kv.alternatives:
        print(f"  tried KV {a.format}: batch {a.batch}, objective {a.objective:.4g}, KL "
              f"{a.measured_kl}, KL long {a.kl_long}, passed {a.passed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
