"""Per-trial cost of persisting the study: Optuna journal file vs SQLite vs in memory.

    python benchmarks/storage_speed.py [--trials 500]

The study is the real one for SmolLM2-135M on h100-sxm/tensorrt-llm (120 decision units);
the surrogate scores are synthetic (storage speed does not depend on them). This is why the
default storage is a journal file: 2,000 trials must fit in the search's time goal.
Results: benchmarks/results/storage_speed.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from autoplan.compress import CompressionSettings
from autoplan.cost.model import CostModel
from autoplan.cost.report import Objective
from autoplan.modelspec import ModelSpec
from autoplan.search.space import build_space
from autoplan.search.study import StudyConfig, run_study
from autoplan.search.tables import build_tables
from autoplan.sensitivity import SensitivityProfile
from autoplan.targets import get_target
from autoplan.workload import Workload

CONFIG = Path(__file__).parents[1] / "autoplan" / "data" / "configs" / "smollm2-135m.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=500)
    args = ap.parse_args()
    spec = ModelSpec.from_path(CONFIG)
    target = get_target("h100-sxm")
    space = build_space(spec, target, "tensorrt-llm")
    cost = CostModel(spec, target, Workload(batch=32, input_len=512, output_len=128))
    rng = np.random.default_rng(0)
    prof = SensitivityProfile("m", "c", CompressionSettings())
    for layer in spec.layers:
        prof.scores[layer.name] = {str(c): float(rng.lognormal(-8, 1)) for c in space.all_choices}
    tables = build_tables(space, cost, prof)
    tmp = Path(tempfile.mkdtemp())
    results = {}
    for label, url in (("memory", None), ("journal", f"journal:{tmp / 's.journal'}"),
                       ("sqlite", f"sqlite:///{tmp / 's.db'}")):
        cfg = StudyConfig(Objective.THROUGHPUT, args.trials, 0, "bench", url)
        t0 = time.perf_counter()
        run_study(tables, 1.0, cost, cfg)
        wall = time.perf_counter() - t0
        results[label] = {"trials": args.trials, "wall_s": round(wall, 2),
                          "ms_per_trial": round(wall / args.trials * 1e3, 2)}
        print(label, results[label], flush=True)
    out = Path(__file__).parent / "results" / "storage_speed.json"
    out.write_text(json.dumps({"units": len(space.units), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
