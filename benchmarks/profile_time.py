"""Sensitivity-profile wall time on SmolLM2-135M: all linear layers x the target's choices,
cold (empty profile cache) and cached, through the real CLI.

    python benchmarks/profile_time.py [--target h100-sxm]

The converted model is prepared first (its one-time GGUF conversion is not profile time).
Results: benchmarks/results/profile_time.json.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="h100-sxm")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="autoplan-prof-"))
    env = dict(os.environ, AUTOPLAN_CACHE=str(cache))
    # Convert the model once (outside the timing): same cache, no profile yet.
    subprocess.run([sys.executable, "-c", "from autoplan.models import load_model; "
                    "load_model('smollm2-135m')"], env=env, check=True)
    shutil.rmtree(cache / "profiles", ignore_errors=True)
    cmd = [sys.executable, "-m", "autoplan.cli", "profile", "--target", args.target, "--json"]
    runs = {}
    for label in ("cold", "cached"):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        wall = time.perf_counter() - t0
        doc = json.loads(out)
        runs[label] = {"wall_s": round(wall, 1), "layers": len(doc["layers"]),
                       "choices": doc["choices"], "calibration_tokens": doc["tokens"]}
        print(label, runs[label], flush=True)
    result = {"command": f"autoplan profile --target {args.target}", "cpu_count": os.cpu_count(),
              "runs": runs}
    path = Path(__file__).parent / "results" / "profile_time.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
