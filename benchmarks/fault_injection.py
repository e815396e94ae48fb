"""Fault injection: SIGKILL the processes of a shared search at random, restart them, and check
that the search still finishes with every stored trial kept and exact trial counts.

    python benchmarks/fault_injection.py [--kills 20] [--storage postgresql|journal]
        [--workers 3] [--trials 3000] [--model tiny|MODEL] [--seed 0]

One `autoplan search` (the driver) and `--workers` `autoplan worker` processes share one
study (PostgreSQL from Debian's package, tests/postgres.py, or a journal file). Every 0.3-2 s
(seeded), one process that holds a job (a trial batch, a measurement, or the driver's
lease) is killed with SIGKILL and started again with the same command. Before each kill the
stored trials of every round study are read; at the end the script checks, for each kill:
every trial stored before it is still stored (0 lost), and for the whole search: each
round study holds exactly its planned trial count, no trial number twice, every batch
exactly its size (a killed holder's batch was finished by another process without
re-running what it had stored), and the driver exited 0 having written its plan.
`--model tiny` (default) is the tests' tiny Llama (tests/unit/_tiny.py): what is injected
and checked is the storage and job queue, which do not depend on the model's size.
Results: benchmarks/results/fault_injection.json.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import start_run, write_result  # noqa: E402

from autoplan.search.jobs import open_storage  # noqa: E402
from autoplan.search.optimize import stored_by  # noqa: E402

STUDY = "fault-injection"


def _command(kind: str, url: str, model: str, trials: int, out: Path) -> list[str]:
    base = [sys.executable, "-m", "autoplan.cli"]
    if kind == "driver":
        return base + ["search", "--model", model, "--target", "h100-sxm", "--runtime", "vllm",
                       "--trials", str(trials), "--batch", "8", "--input-len", "128",
                       "--output-len", "32", "--storage", url, "--study", STUDY,
                       "--out", str(out), "--quiet"]
    return base + ["worker", "--storage", url, "--study", STUDY, "--wait", "300", "--quiet"]


def _studies(storage) -> list[str]:  # noqa: ANN001 - the round studies (not the job queue)
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
            if s.study_name.startswith(STUDY) and not s.study_name.endswith(".jobs")]


def _stored(storage) -> dict[str, list[optuna.trial.FrozenTrial]]:  # noqa: ANN001
    return {name: optuna.load_study(study_name=name, storage=storage).get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)) for name in _studies(storage)}


def _holders(storage) -> dict[int, str]:  # noqa: ANN001 - pid -> kind of job it holds
    try:
        jobs = optuna.load_study(study_name=f"{STUDY}.jobs", storage=storage)
    except KeyError:
        return {}
    out = {}
    for t in jobs.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = (t.system_attrs.get("owner") or {}).get("worker", "")
        parts = worker.split("/")
        if len(parts) >= 2 and parts[1].isdigit():
            out[int(parts[1])] = t.user_attrs.get("kind", "?")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--storage", choices=["postgresql", "journal"], default="postgresql")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--trials", type=int, default=3000)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    info, command = start_run(args.seed, None)
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="autoplan-fi-"))
    env = os.environ | {"AUTOPLAN_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}
    model = args.model
    if model == "tiny":
        from tests.unit._tiny import save_tiny_folder

        model = str(save_tiny_folder(tmp / "tiny-llama"))
    server = None
    if args.storage == "postgresql":
        from tests.postgres import PostgresServer

        server = PostgresServer().__enter__()
        url = server.url
    else:
        url = f"journal:{tmp / 'study.journal'}"
    out = tmp / "plan.json"
    try:
        storage = open_storage(url)
        procs = {"driver": subprocess.Popen(_command("driver", url, model, args.trials, out),
                                            env=env, cwd=tmp)}
        for i in range(args.workers):
            procs[f"worker{i}"] = subprocess.Popen(_command("worker", url, model, args.trials,
                                                            out), env=env, cwd=tmp)
        t0 = time.perf_counter()
        kills = []
        while len(kills) < args.kills:
            time.sleep(rng.uniform(0.3, 2.0))
            if procs["driver"].poll() is not None:
                break  # the search finished before every kill was made
            holders = _holders(storage)
            live = {name: p for name, p in procs.items() if p.poll() is None and p.pid in holders}
            if not live:
                continue
            name = rng.choice(sorted(live))
            before = {s: {t.number for t in ts} for s, ts in _stored(storage).items()}
            procs[name].send_signal(signal.SIGKILL)
            procs[name].wait()
            kind = "driver" if name == "driver" else "worker"
            procs[name] = subprocess.Popen(_command(kind, url, model, args.trials, out), env=env,
                                           cwd=tmp)
            kills.append({"t_s": round(time.perf_counter() - t0, 2), "victim": name,
                          "holding": holders[live[name].pid],
                          "stored_before": sum(len(v) for v in before.values()),
                          "_before": before})
            print(f"kill {len(kills)}: {name} holding {kills[-1]['holding']} job, "
                  f"{kills[-1]['stored_before']} trials stored", flush=True)
        rc = procs["driver"].wait(timeout=3600)
        for name, p in procs.items():
            if name != "driver":
                p.wait(timeout=600)
        wall = time.perf_counter() - t0
        final = _stored(storage)
        final_numbers = {s: {t.number for t in ts} for s, ts in final.items()}
        for k in kills:
            before = k.pop("_before")
            k["lost"] = sum(len(nums - final_numbers.get(s, set())) for s, nums in before.items())
        plans = {}
        for name, trials in final.items():
            numbers = Counter(t.number for t in trials)
            batches = Counter(stored_by(t)[1] for t in trials)
            queue = optuna.load_study(study_name=f"{STUDY}.jobs", storage=storage)
            plan = queue.user_attrs.get(f"plan:{name}", {})
            sizes = {f"{name}#{i}": n for i, n in enumerate(plan.get("sizes", []))}
            plans[name] = {"planned": plan.get("total"), "stored": len(trials),
                           "duplicate_numbers": sum(n - 1 for n in numbers.values()),
                           "batches_off_size": sum(batches.get(b, 0) != n
                                                   for b, n in sizes.items())}
        jobs = optuna.load_study(study_name=f"{STUDY}.jobs", storage=storage).get_trials(
            deepcopy=False)
        retried = sum("failed_trial" in t.system_attrs for t in jobs)
        exact = all(p["planned"] == p["stored"] and not p["duplicate_numbers"]
                    and not p["batches_off_size"] for p in plans.values())
        resumed = sum(k["lost"] == 0 for k in kills) if (rc == 0 and out.exists() and exact) \
            else 0
        doc = {"machine": info, "command": command, "storage": args.storage,
               "workers": args.workers, "trials": args.trials,
               "model": "tiny (tests/unit/_tiny.py)" if args.model == "tiny" else args.model,
               "kills": len(kills), "resumed": resumed,
               "lost_trials": sum(k["lost"] for k in kills), "exact_counts": exact,
               "retried_jobs": retried, "driver_exit": rc, "plan_written": out.exists(),
               "wall_s": round(wall, 1), "load_1min_end": round(os.getloadavg()[0], 2),
               "studies": plans, "kill_log": kills}
        print(f"{resumed}/{len(kills)} kills resumed, {doc['lost_trials']} stored trials lost, "
              f"exact counts: {exact}, {retried} jobs re-queued, driver exit {rc}")
        write_result(Path(__file__).parent / "results" / f"fault_injection_{args.storage}.json",
                     doc)
    finally:
        for p in list(locals().get("procs", {}).values()):
            if p.poll() is None:
                p.kill()
        if server is not None:
            server.__exit__(None, None, None)


if __name__ == "__main__":
    main()
