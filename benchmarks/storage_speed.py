"""Per-trial cost of storing the study: in memory, journal file, SQLite, PostgreSQL; one
process and several processes on one study; the stored-trial format before and after.

    python benchmarks/storage_speed.py [--trials 300] [--old-trials 60] [--workers 3]
        [--repeats 3]

The study is the real one for SmolLM2-135M on h100-sxm/tensorrt-llm (120 decision units);
the surrogate scores are synthetic (storage speed does not depend on them). PostgreSQL is a
throwaway server from Debian's `postgresql` package (tests/postgres.py, default durability
settings), skipped when the binaries or psycopg are missing.

- "after": autoplan's storage path (autoplan.search.optimize.run_study with a storage: the job
  queue's batches, each trial stored as its value and ONE user attribute);
- "before": what autoplan stored until this change, each trial as Optuna stores it, with one
  parameter per unit (the in-memory trial passed to `add_trial`, as study.py did);
- with --workers W, W processes on one study: "after" shares one trial budget through the
  job queue; "before" is W processes each storing their own trials, as three `autoplan
  search` processes on one study did. Figures are wall ms per stored trial, over all
  processes (the rate the study grows), and per process.

Sides are interleaved, repeated, and the median taken; the 1-minute load average is recorded
beside each figure (the reference machine is shared). Results:
benchmarks/results/storage_speed.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import machine_info, write_result  # noqa: E402

from autoplan.compress import CompressionSettings  # noqa: E402
from autoplan.cost.model import CostModel  # noqa: E402
from autoplan.cost.report import Objective  # noqa: E402
from autoplan.modelspec import ModelSpec  # noqa: E402
from autoplan.search import build_space  # noqa: E402
from autoplan.search.jobs import JobQueue, load_or_create, open_storage
from autoplan.search.optimize import ExchangeSampler, StudyConfig, build_tables, run_study
from autoplan.sensitivity import SensitivityProfile  # noqa: E402
from autoplan.targets import get_target  # noqa: E402
from autoplan.workload import Workload  # noqa: E402

CONFIG = Path(__file__).parents[1] / "autoplan" / "data" / "configs" / "smollm2-135m.json"
LIMIT = 1.0


def _tables():  # noqa: ANN202 - (tables, cost)
    spec = ModelSpec.from_path(CONFIG)
    target = get_target("h100-sxm")
    space = build_space(spec, target, "tensorrt-llm")
    cost = CostModel(spec, target, Workload(batch=32, input_len=512, output_len=128))
    rng = np.random.default_rng(0)
    prof = SensitivityProfile("m", "c", CompressionSettings())
    for layer in spec.layers:
        prof.scores[layer.name] = {str(c): float(rng.lognormal(-8, 1)) for c in space.all_choices}
    return build_tables(space, cost, prof), cost


def _before(tables, cost, url: str, name: str, trials: int, seed: int) -> None:  # noqa: ANN001
    """The storage path autoplan had before: sample in memory, `add_trial` the whole trial
    (one Optuna parameter per unit) to the storage at once."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    persist = load_or_create(open_storage(url), name, ["maximize"])
    memory = optuna.create_study(directions=["maximize"],
                                 sampler=ExchangeSampler(tables, LIMIT, seed=seed))
    units = tables.space.units

    def objective(trial: optuna.Trial) -> float:
        picks = [tables.label_index[i][trial.suggest_categorical(u.name, tables.labels[i])]
                 for i, u in enumerate(units)]
        trial.set_user_attr("surrogate", tables.surrogate(picks))
        trial.set_constraint("quality", tables.surrogate(picks) - LIMIT)
        return cost.metric_from_times(*tables.times(picks), Objective.THROUGHPUT)

    memory.optimize(objective, n_trials=trials,
                    callbacks=[lambda s, t: persist.add_trial(t)
                               if t.state == TrialState.COMPLETE else None])


def _after(tables, cost, url: str, name: str, trials: int, seed: int) -> None:  # noqa: ANN001
    """autoplan's path: run_study with a storage (batches from the study's job queue)."""
    run_study(tables, LIMIT, cost, StudyConfig(Objective.THROUGHPUT, trials, seed, name,
                                               open_storage(url)))


def _child(args: argparse.Namespace) -> None:
    tables, cost = _tables()  # not timed: the same for every storage
    t0 = time.perf_counter()
    (_before if args.child == "before" else _after)(tables, cost, args.url, args.name,
                                                    args.trials, args.seed)
    print(f"wall {time.perf_counter() - t0:.4f}", flush=True)


def _stored(url: str, name: str) -> int:
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _run(side: str, url: str, name: str, trials: int, workers: int) -> dict:
    """`workers` processes on study `name`: after, sharing `trials`; before, each storing
    trials // workers of its own. Wall time from start to the last process's end."""
    if side == "after":  # the driver's part: plan the batches once, before the workers
        JobQueue(open_storage(url), name).plan_batches(name, trials, 0, {"limit": LIMIT})
    each = trials if side == "after" else trials // workers
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--child", side, "--url", url,
                               "--name", name, "--trials", str(each), "--seed", str(i)],
                              stdout=subprocess.PIPE, text=True) for i in range(workers)]
    walls = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"{side} worker failed ({p.returncode})")
        walls.append(float(out.split("wall")[-1]))
    wall = time.perf_counter() - t0
    stored = _stored(url, name)
    # process start (imports, tables) is not storage: each process's own study wall counts
    busy = max(walls)
    return {"stored": stored, "wall_s": round(wall, 2), "busy_s": round(busy, 2),
            "ms_per_stored_trial": round(busy / stored * 1e3, 2),
            "ms_per_trial_per_process": round(statistics.median(walls) / (stored / workers)
                                              * 1e3, 2),
            "load_1min": round(load, 2)}


def _storages(tmp: Path, pg_url: str | None) -> list[tuple[str, str]]:
    out = [("journal", f"journal:{tmp / 's.journal'}"), ("sqlite", f"sqlite:///{tmp / 's.db'}")]
    return out + ([("postgresql", pg_url)] if pg_url else [])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300, help="trials per 'after' run")
    ap.add_argument("--old-trials", type=int, default=60,
                    help="trials per 'before' run (the old format is ~100x slower on an RDB)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=["before", "after"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from tests.postgres import PostgresServer, why_not_available

    tmp = Path(tempfile.mkdtemp())
    reason = why_not_available()
    server = PostgresServer() if reason is None else None
    if reason:
        print(f"PostgreSQL skipped: {reason}")
    runs: dict[str, list[dict]] = {}
    with server or _Null():
        pg_url = server.url if server else None
        # memory: the floor (sampling alone), for reference
        tables, cost = _tables()
        t0 = time.perf_counter()
        run_study(tables, LIMIT, cost, StudyConfig(Objective.THROUGHPUT, args.trials, 0, "m",
                                                   None))
        memory_ms = (time.perf_counter() - t0) / args.trials * 1e3
        for r in range(args.repeats):  # interleaved: every side once per repeat
            for label, url in _storages(tmp, pg_url):
                for workers in sorted({1, args.workers}):
                    if label == "sqlite" and workers > 1:
                        continue  # Optuna: SQLite is not for parallel workers
                    for side in ("before", "after"):
                        name = f"{label}-{side}-{workers}-{r}"
                        n = args.trials if side == "after" else args.old_trials
                        row = _run(side, url, name, n, workers)
                        runs.setdefault(f"{label}|{workers}|{side}", []).append(row)
                        print(label, workers, side, row, flush=True)
    results = {}
    for key, rows in runs.items():
        label, workers, side = key.split("|")
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("ms_per_stored_trial", "ms_per_trial_per_process", "load_1min")}
        results.setdefault(label, {}).setdefault(f"{workers}_workers", {})[side] = \
            med | {"runs": rows}
    for by_w in results.values():
        for sides in by_w.values():
            if "before" in sides and "after" in sides:
                sides["speedup"] = round(sides["before"]["ms_per_stored_trial"]
                                         / sides["after"]["ms_per_stored_trial"], 1)
    doc = {"units": len(tables.space.units), "machine": machine_info(),
           "memory_ms_per_trial": round(memory_ms, 2), "trials_after": args.trials,
           "trials_before": args.old_trials, "workers": args.workers,
           "repeats": args.repeats, "results": results}
    write_result(Path(__file__).parent / "results" / "storage_speed.json", doc)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
