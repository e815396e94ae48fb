"""What sharding the profile over Ray costs: the scoring of SmolLM2-135M's layers x the
target's choices, in one process and on a local Ray cluster of 2 CPU workers, same tasks.

    python benchmarks/ray_overhead.py [--blocks 4] [--repeats 3] [--threads 1]

The capture pass (forward + backward on the driver, identical either way) runs once and is
timed on its own; what is compared is the part Ray shards, the per-layer scoring tasks:

- serial: SerialExecutor, this process;
- ray x1: RayExecutor with one task in flight (pure Ray cost: object store, scheduling,
  result transfer; goal <= 15 % over serial);
- ray x2: RayExecutor with both workers busy (the speed-up, bounded by free cores).

Runs are interleaved (serial, x1, x2, serial, ...) and each records the load average, since
the machine is shared. Every run's profile must equal the serial one bit for bit. The
cluster's start and the workers' first task (importing torch) are one-off and reported apart.
Results: benchmarks/results/ray_overhead.json (and a table for docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import start_run  # noqa: E402


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:  # noqa: PLR0915 - one linear script
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="h100-sxm")
    ap.add_argument("--blocks", type=int, default=4, help="decoder blocks whose layers are scored")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process/worker")
    args = ap.parse_args()
    info, command = start_run(0, None)

    import torch

    from autoplan.compress import CompressionSettings
    from autoplan.models import load_model
    from autoplan.quality.text import load_text_dataset
    from autoplan.sensitivity.capture import capture
    from autoplan.sensitivity.executor import SerialExecutor
    from autoplan.sensitivity.profile import _task, score_task
    from autoplan.sensitivity.ray_executor import RayExecutor
    from autoplan.sensitivity.targets import profile_scope
    from autoplan.targets import get_target

    torch.set_num_threads(args.threads)  # before Ray starts: workers use the driver's count
    loaded = load_model("smollm2-135m")  # converted once, outside any timing
    layers, scope, _ = profile_scope(loaded.spec, get_target(args.target), None)
    layers = [n for n in layers
              if any(n.startswith(f"model.layers.{b}.") for b in range(args.blocks))]
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=4,
                             n_eval=0, seed=0)
    batches = list(data.calib.split(2))  # as `autoplan profile` does
    print(f"{len(layers)} layers x {len(scope)} choices, {data.calib.numel()} calibration tokens")

    t0 = time.perf_counter()
    cap = capture(loaded.model, layers, batches, seed=0)
    capture_s = time.perf_counter() - t0
    settings = CompressionSettings()
    tasks = [_task(loaded.model, n, scope, cap, settings) for n in layers]
    print(f"capture pass (driver only): {capture_s:.1f} s, load {_load()}", flush=True)

    def run(executor) -> tuple[float, dict]:  # noqa: ANN001
        t = time.perf_counter()
        out = {r.layer: (r.scores, r.outlier) for _, r in executor.imap_unordered(score_task, tasks)}
        return time.perf_counter() - t, out

    t0 = time.perf_counter()
    ray2 = RayExecutor("auto", num_cpus=2)
    start_s = time.perf_counter() - t0
    ray1 = RayExecutor("auto", max_in_flight=1)  # same cluster, one task at a time
    t0 = time.perf_counter()
    warm, _ = run(ray2)  # starts both workers (each imports torch once)
    print(f"ray cluster start {start_s:.1f} s; first (warm-up) pass on 2 workers {warm:.1f} s",
          flush=True)

    executors = {"serial": SerialExecutor(), "ray x1": ray1, "ray x2": ray2}
    walls: dict[str, list[float]] = {k: [] for k in executors}
    loads: dict[str, list[list[float]]] = {k: [] for k in executors}
    reference = None
    identical = True
    for rep in range(args.repeats):
        for label, ex in executors.items():
            load = _load()
            wall, out = run(ex)
            reference = reference or out
            identical &= out == reference
            walls[label].append(round(wall, 2))
            loads[label].append(load)
            print(f"repeat {rep + 1} {label}: {wall:.1f} s (load {load}), same profile: "
                  f"{out == reference}", flush=True)
    ray2.close()

    med = {k: statistics.median(v) for k, v in walls.items()}
    result = {
        "command": command, "machine": info, "target": args.target,
        "layers": len(layers), "choices": [str(c) for c in scope],
        "calibration_tokens": int(data.calib.numel()), "torch_threads_per_process": args.threads,
        "ray_version": __import__("ray").__version__,
        "capture_s": round(capture_s, 1), "ray_cluster_start_s": round(start_s, 1),
        "ray_first_pass_s": round(warm, 1),
        "scoring_wall_s": walls, "load_before_each_run": loads,
        "median_s": {k: round(v, 2) for k, v in med.items()},
        "overhead_ray_x1_vs_serial": round(med["ray x1"] / med["serial"] - 1, 3),
        "speedup_ray_x2_vs_serial": round(med["serial"] / med["ray x2"], 3),
        "overhead_ray_x2_vs_ideal_half": round(2 * med["ray x2"] / med["serial"] - 1, 3),
        "identical_profiles": identical,
        "note": "measured; the scoring tasks only (capture pass timed apart); load averages "
                "are os.getloadavg() on a shared 2-core machine",
    }
    print(json.dumps({k: result[k] for k in ("median_s", "overhead_ray_x1_vs_serial",
                                             "speedup_ray_x2_vs_serial",
                                             "overhead_ray_x2_vs_ideal_half",
                                             "identical_profiles")}))
    path = Path(__file__).parent / "results" / "ray_overhead.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    main()
