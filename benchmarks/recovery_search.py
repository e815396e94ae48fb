"""Goal 2 of recovery: a TensorRT-LLM search for H100 under a KL budget without and with
--recover distill, the 2:4 layers each plan uses, then the recovered plan's per-layer pattern
on an 8B shape (benchmarks/recovery_speed.py, cost-model prediction, not a measurement).

  --model smollm2-135m   the goal: the embedded model with the search's default data (pydoc,
                         seq_len 256, 4 calibration / 6 evaluation blocks)
  --model tiny           the unit tests' tiny Llama (seconds; the mechanism only, as
                         tests/unit/test_recover_search.py asserts it)

Usage:
  python benchmarks/recovery_search.py --model smollm2-135m [--recover-steps 60]
      [--recover-lr 5e-4] [--budget 'kl<=0.05'] [--trials 2000] [--out FILE]
  python benchmarks/recovery_search.py --model tiny   # recovery_tiny_search.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.unit._tiny
from _common import start_run, write_result  # noqa: E402
from recovery_speed import main as speed_main  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' or a model autoplan loads")
    ap.add_argument("--budget", default="kl<=0.05")
    ap.add_argument("--trials", type=int, default=None, help="default: 100 tiny, 2000 else")
    ap.add_argument("--prune-score", default=None, help="default: the search's own")
    ap.add_argument("--recover-steps", type=int, default=None, help="default: 20 tiny, 150")
    ap.add_argument("--recover-lr", type=float, default=None, help="default: 1e-3 tiny, 1e-4")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    tiny = args.model == "tiny"
    out = Path(args.out or RESULTS / ("recovery_tiny_search.json" if tiny
                                      else "recovery_search.json"))
    info, command = start_run(0, argv)
    work = Path(tempfile.mkdtemp())
    os.environ["AUTOPLAN_CACHE"] = str(work / "cache")
    from autoplan.compress import CompressionSettings
    from autoplan.formats import Choice
    from autoplan.recover import RecoverySettings
    from autoplan.search import SearchRequest, run_search

    extra: dict = {}
    if tiny:
        from tests.unit._tiny import FAST, WORKLOAD, save_tiny_folder

        torch.set_num_threads(1)  # tiny GEMMs: a second thread only spins
        model = str(save_tiny_folder(work / "model"))
        extra = {**FAST, "workload": WORKLOAD}
        rec = RecoverySettings(steps=args.recover_steps or 20, lr=args.recover_lr or 1e-3,
                               seq_len=64)
    else:
        model = args.model
        rec = RecoverySettings(steps=args.recover_steps or 150, lr=args.recover_lr or 1e-4)
    if args.prune_score:
        extra["settings"] = CompressionSettings(args.prune_score, "rtn")
    rows = {}
    for name, recovery in (("without", None), ("with", rec)):
        t0 = time.perf_counter()
        plan = run_search(SearchRequest(
            model=model, target="h100-sxm", runtime="tensorrt-llm", budget=args.budget,
            trials=args.trials or (100 if tiny else 2000), out=work / f"{name}.json",
            recovery=recovery, **extra)).plan
        rows[name] = {
            "layers_2_4": sum(Choice.parse(c).sparsity.kind == "nm"
                              for c in plan.decisions.values()),
            "layers": len(plan.decisions), "kl": plan.quality.kl,
            "slices": plan.quality.slices, "budget_met": plan.quality.budget_met,
            "unrecovered_kl": plan.recovery.unrecovered.kl if plan.recovery else None,
            "outcome": plan.search.outcome, "evaluations": plan.search.real_evaluations,
            "decisions": plan.decisions, "wall_s": time.perf_counter() - t0}
        print(f"{name} --recover: {rows[name]['layers_2_4']} 2:4 layers of "
              f"{rows[name]['layers']}, KL {plan.quality.kl:.4f}, "
              f"{rows[name]['wall_s']:.0f} s", flush=True)
    speed_main([str(work / "with.json"), "--out", str(work / "speed.json")])
    speed = json.loads((work / "speed.json").read_text())
    speed["command"] = "python benchmarks/recovery_speed.py PLAN.json  # the 'with' plan"
    rows["with"]["on_8b_shape"] = speed
    write_result(out, {"machine": info, "command": command, "model": args.model,
                       "budget": args.budget, "recovery": rec.to_dict(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
