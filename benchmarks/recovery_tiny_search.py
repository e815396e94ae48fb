"""The --recover mechanism end to end on the unit tests' tiny Llama (seconds, not the goal):
a TensorRT-LLM search for H100 under kl<=0.05 without and with --recover distill, then the
recovered plan's per-layer pattern on an 8B shape (benchmarks/recovery_speed.py, predicted).

Usage: python benchmarks/recovery_tiny_search.py [--out benchmarks/results/recovery_tiny_search.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.unit._tiny
from _common import start_run, write_result  # noqa: E402
from recovery_speed import main as speed_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "recovery_tiny_search.json"))
    args = ap.parse_args(argv)
    info, command = start_run(0, argv)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp())
    os.environ["AUTOPLAN_CACHE"] = str(work / "cache")
    from autoplan.formats import Choice
    from autoplan.recover import RecoverySettings
    from autoplan.search.run import SearchRequest, run_search
    from tests.unit._tiny import FAST, WORKLOAD, save_tiny_folder

    model = save_tiny_folder(work / "model")
    rows = {}
    for name, rec in (("without", None),
                      ("with", RecoverySettings(steps=20, lr=1e-3, seq_len=64))):
        plan = run_search(SearchRequest(
            model=str(model), target="h100-sxm", runtime="tensorrt-llm", budget="kl<=0.05",
            trials=100, out=work / f"{name}.json", workload=WORKLOAD, **FAST,
            recovery=rec)).plan
        rows[name] = {
            "layers_2_4": sum(Choice.parse(c).sparsity.kind == "nm"
                              for c in plan.decisions.values()),
            "layers": len(plan.decisions), "kl": plan.quality.kl,
            "budget_met": plan.quality.budget_met,
            "unrecovered_kl": plan.recovery.unrecovered.kl if plan.recovery else None,
            "outcome": plan.search.outcome, "evaluations": plan.search.real_evaluations}
    speed_main([str(work / "with.json"), "--out", str(work / "speed.json")])
    import json

    rows["with"]["on_8b_shape"] = json.loads((work / "speed.json").read_text())
    write_result(args.out, {"machine": info, "command": command, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
