"""Wall time of `autoplan compare` over six targets on the embedded model, cold and warm.

    python benchmarks/compare_walltime.py [--targets h100,h200,b200,mi300x,mi355x,xeon-8480]
        [--extra=--execution=memory]

Cold: a fresh AUTOPLAN_CACHE holding only the converted embedded model (copied from the
current cache, so the one-time GGUF conversion is not counted) and no profile. Then the
same command again into a new output folder each time (new studies: every trial runs again):
"warm, profile only": the profile cached, the measurement cache emptied first, so every
candidate is measured again; "warm": the profile and the earlier runs' measurements cached
(autoplan/search/measurement_cache.py), as a rerun finds them. Each run is the real CLI in a
subprocess; its compare.json gives the profile time, the measurements run, those shared
between targets and those answered from the cache, and the table. The 1-minute load
average is recorded before and after each run (the machine is shared).
Results: benchmarks/results/compare_walltime.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_info, write_result

RESULTS = Path(__file__).parent / "results" / "compare_walltime.json"
TARGETS = "h100,h200,b200,mi300x,mi355x,xeon-8480"


def _cache_with_model_only(dest: Path) -> None:
    """A cache with the converted embedded model and nothing else (no profiles, no tables)."""
    src = Path(os.environ.get("AUTOPLAN_CACHE", Path.home() / ".cache" / "autoplan"))
    (dest / "models").mkdir(parents=True)
    for folder in (src / "models").glob("smollm2-135m-*"):
        shutil.copytree(folder, dest / "models" / folder.name)
    if (src / "hashes.json").is_file():
        shutil.copy2(src / "hashes.json", dest / "hashes.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=TARGETS)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--extra", nargs="*", default=[], help="extra autoplan compare flags")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autoplan-compare-"))
    _cache_with_model_only(work / "cache")
    env = dict(os.environ, AUTOPLAN_CACHE=str(work / "cache"))
    cmd = ["compare", "--targets", args.targets, "--trials", str(args.trials), *args.extra]
    runs = {}
    for label in ("cold", "warm, profile only", "warm"):
        if label == "warm, profile only":
            shutil.rmtree(work / "cache" / "measurements", ignore_errors=True)
        out = work / label.replace(", ", "-").replace(" ", "-")
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autoplan.cli", *cmd, "--quiet", "--out", str(out)],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        doc = json.loads((out / "compare.json").read_text())
        runs[label] = {
            "wall_s": round(wall, 1), "load_1min_before": round(load_before, 2),
            "load_1min_after": round(os.getloadavg()[0], 2),
            "profile_s": round(doc["profile_s"], 1), "profile_entries": doc["profile_entries"],
            "measurements": doc["measurements"], "reused_measurements": doc["reused_measurements"],
            "cached_measurements": doc.get("cached_measurements", 0),
            "rows": [{k: r[k] for k in ("target", "runtime", "status", "batch", "kl", "outcome",
                                         "gain_over_baseline", "gain_over_best_uniform",
                                         "best_uniform_name", "real_evaluations", "wall_s")}
                     | ({"plan_tokens_per_s": r["plan"]["tokens_per_s"],
                         "baseline_tokens_per_s": r["baseline"]["tokens_per_s"],
                         "usd_per_1m_tokens": r["plan"]["usd_per_1m_tokens"],
                         "decisions": r["decisions"]} if r["plan"] else {})
                     for r in doc["rows"]],
        }
        print(label, json.dumps({k: v for k, v in runs[label].items() if k != "rows"}),
              flush=True)
    write_result(RESULTS, {"machine": machine_info(), "command": " ".join(["autoplan", *cmd]),
                           "runs": runs})
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
