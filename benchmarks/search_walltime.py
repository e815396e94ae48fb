"""End-to-end wall time of the main job, cold and with the profile cached.

    python benchmarks/search_walltime.py [--target h100-sxm] [--trials 2000]

Cold: an empty AUTOPLAN_CACHE (GGUF conversion + profile + search + verification).
Cached: the same command again with a new plan path (a new study), the profile and the
converted model coming from the cache. Each run is the real CLI in a subprocess; the plan it
writes gives trials, real evaluations, the certificate gap and the gain over the best
uniform recipe. Results: benchmarks/results/search_walltime.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_info

RESULTS = Path(__file__).parent / "results" / "search_walltime.json"


def run(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100-sxm")
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--extra", nargs="*", default=[], help="extra autoplan search flags")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autoplan-bench-"))
    env = dict(os.environ, AUTOPLAN_CACHE=str(work / "cache"))
    base = [sys.executable, "-m", "autoplan.cli", "search", "--target", args.target,
            "--trials", str(args.trials), "--quiet", *args.extra]
    rows = {}
    for label in ("cold", "cached"):
        out = work / f"{label}.json"
        wall = run([*base, "--out", str(out)], env)
        plan = json.loads(out.read_text())
        s = plan["search"]
        rows[label] = {
            "wall_s": round(wall, 1), "trials": s["trials"],
            "real_evaluations": s["real_evaluations"],
            "gap_to_exact_optimum": s["certificate"]["gap"],
            "gain_over_best_uniform": s["gain_over_best_uniform"],
            "best_uniform": s["best_uniform"], "outcome": s["outcome"],
            "measured_kl": plan["quality"]["kl"], "budget": plan["budget"]["text"],
            "plan_tokens_per_s_predicted": plan["predicted"]["plan"]["tokens_per_s"],
            "baseline_tokens_per_s_predicted": plan["predicted"]["baseline"]["tokens_per_s"],
        }
        print(label, json.dumps(rows[label]), flush=True)
    result = {"machine": machine_info(),
              "command": " ".join(["autoplan", "search", "--target", args.target, "--trials",
                                   str(args.trials), *args.extra]),
              "runs": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
