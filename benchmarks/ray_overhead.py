"""What sharding the profile over Ray costs on this machine: SmolLM2-135M's layers x the
target's choices, in one process and on a local Ray cluster of 2 CPU workers.

    python benchmarks/ray_overhead.py [--blocks 4] [--repeats 3] [--threads 1]
    python benchmarks/ray_overhead.py --end-to-end [--repeats 2]

`--end-to-end` times the whole command a user runs, `autoplan profile --model smollm2-135m
--target h100` against the same with `--ray auto`, each with a cold profile cache (the
converted model is shared), in fresh processes, interleaved; the Ray side includes starting
its cluster. Without it, the scoring tasks alone are compared, as below.

The capture pass (forward + backward on the driver, identical either way) runs once and is
timed on its own; what is compared is the part Ray shards, the per-layer scoring tasks:

- serial: SerialExecutor, this process;
- ray x1: RayExecutor with one task in flight (pure Ray cost: object store, scheduling,
  result transfer; goal <= 15 % over serial);
- ray x2: RayExecutor with both workers busy (the speed-up, bounded by free cores).

Runs are interleaved (serial, x1, x2, serial, ...) and each records the load average, since
the machine is shared. Every run's profile must equal the serial one bit for bit. The
cluster's start and the workers' first task (importing torch) are one-off and reported apart.
Results: benchmarks/results/ray_overhead.json (and a table for docs/lab/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import start_run, write_result  # noqa: E402


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def end_to_end(args: argparse.Namespace, info: dict, command: str) -> None:
    """The whole `autoplan profile`, serial vs --ray auto, cold profile cache each run."""
    import shutil
    import subprocess
    import tempfile

    from autoplan.models import load_model
    from autoplan.cache_dir import cache_root

    load_model("smollm2-135m")  # converted once into the shared cache, outside any timing
    models = cache_root() / "models"
    sides = {"serial": [], "ray x2": ["--ray", "auto"]}
    walls: dict[str, list[float]] = {k: [] for k in sides}
    loads: dict[str, list[list[float]]] = {k: [] for k in sides}
    profiles: dict[str, dict] = {}
    for rep in range(args.repeats):
        for label, extra in sides.items():
            cache = Path(tempfile.mkdtemp(prefix="ray-e2e-"))
            shutil.copytree(models, cache / models.name)  # the converted model, no profile
            cmd = [sys.executable, "-m", "autoplan.cli", "profile", "--model", "smollm2-135m",
                   "--target", args.target, "--json", *extra]
            load = _load()
            t = time.perf_counter()
            out = subprocess.run(cmd, env=dict(os.environ, AUTOPLAN_CACHE=str(cache)),
                                 capture_output=True, text=True)
            wall = time.perf_counter() - t
            shutil.rmtree(cache, ignore_errors=True)
            if out.returncode:
                raise SystemExit(f"{label} failed: {out.stderr[-1500:]}")
            doc = json.loads(out.stdout)
            profiles.setdefault(label, doc["layers"])
            walls[label].append(round(wall, 1))
            loads[label].append(load)
            print(f"repeat {rep + 1} {label}: {wall:.1f} s (load {load})", flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    result = {
        "command": command, "machine": info, "target": args.target, "mode": "end to end",
        "ray_version": importlib.metadata.version("ray"), "wall_s": walls,
        "load_before_each_run": loads, "median_s": {k: round(v, 1) for k, v in med.items()},
        "overhead_ray_x2_vs_serial": round(med["ray x2"] / med["serial"] - 1, 3),
        "identical_profiles": profiles["serial"] == profiles["ray x2"],
        "note": "measured; whole `autoplan profile` commands (model load, capture pass, "
                "scoring; the Ray side also starts its local cluster), cold profile cache; "
                "load averages are os.getloadavg() on a shared 2-core machine",
    }
    print(json.dumps({k: result[k] for k in ("median_s", "overhead_ray_x2_vs_serial",
                                             "identical_profiles")}))
    write_result(Path(__file__).parent / "results" / "ray_overhead_end_to_end.json", result)


def main() -> None:  # noqa: PLR0915 - one linear script
    ap = argparse.ArgumentParser()
    ap.add_argument("--end-to-end", action="store_true",
                    help="time whole `autoplan profile` commands, serial vs --ray auto")
    ap.add_argument("--target", default="h100-sxm")
    ap.add_argument("--blocks", type=int, default=4, help="decoder blocks whose layers are scored")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process/worker")
    args = ap.parse_args()
    info, command = start_run(0, None)
    if args.end_to_end:
        end_to_end(args, info, command)
        return

    import torch

    from autoplan.compress import CompressionSettings
    from autoplan.models import load_model
    from autoplan.quality.text import load_text_dataset
    from autoplan.sensitivity.capture import capture
    from autoplan.sensitivity.executor import SerialExecutor
    from autoplan.search import profile_scope
    from autoplan.sensitivity.profile import make_task, score_task
    from autoplan.sensitivity.ray_executor import RayExecutor
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
    tasks = [make_task(loaded.model, n, scope, cap, settings) for n in layers]
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
    write_result(Path(__file__).parent / "results" / "ray_overhead.json", result)

if __name__ == "__main__":
    main()
