"""How fast the CLI answers: `autoplan --help`, a bad target, a missing plan file, and every
argument-only case of the bad-input corpus (tests/unit/test_bad_input_corpus.py, `ARGS`),
each a fresh `python -m autoplan.cli` process, wall time, median of 5.

With `--before DIR` (a checkout of an older autoplan, e.g. `git worktree add DIR REV`) each
command also runs on that code (`PYTHONPATH=DIR`), interleaved with the current one (old,
new, old, new, ...), so both see the same machine load:

    python benchmarks/cli_latency.py [--before DIR] [--repeat 5] [--only-headline]
        -> benchmarks/results/cli_latency.json

The goal (issue 29): every argument-only case answered in under 1 s on this machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine_info, write_result  # noqa: E402

HEADLINE = ("--help", "search --target nope", "show missing.json")
GOAL_S = 1.0


def _corpus_args() -> list[str]:
    from tests.unit.test_bad_input_corpus import CASES

    return [c.values[0].command for c in CASES if c.values[0].args_only]


def _inputs(root: Path) -> dict[str, str]:
    from tests.unit._tiny import save_tiny_folder
    from tests.unit.test_bad_input_corpus import build_inputs

    tiny = save_tiny_folder(root / "tiny")
    (root / "cache").mkdir(exist_ok=True)
    (root / "inputs").mkdir(exist_ok=True)
    return build_inputs(root / "inputs", tiny, root / "cache") | {"cache": str(root / "cache")}


def _one(command: str, shared: dict[str, str], pythonpath: str | None
         ) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, exit code, stderr lines) of one fresh process in a fresh
    folder. CPU time (user + system, from the children's rusage) is what the process itself
    costs; wall time adds the wait for a core, which a shared machine's load inflates."""
    with tempfile.TemporaryDirectory(prefix="autoplan-cli-") as tmp:
        t = Path(tmp)
        (t / "afile").write_text("x")
        (t / "adir").mkdir()
        (t / "mine").mkdir()
        (t / "mine" / "notes.txt").write_text("the user's own file")
        args = [a.format(tmp=t, **shared) for a in shlex.split(command)]
        env = dict(os.environ, AUTOPLAN_CACHE=shared["cache"])
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        t0, cpu0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run([sys.executable, "-m", "autoplan.cli", *args], cwd=t, env=env,
                              capture_output=True, text=True, check=False, timeout=300)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return wall, cpu, proc.returncode, len(lines)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default=None, help="an older checkout to compare with")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--only-headline", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/cli_latency.json"))
    args = p.parse_args()
    load_start = os.getloadavg()  # the machine's load beside the times (it stretches them)
    with tempfile.TemporaryDirectory(prefix="autoplan-cli-inputs-") as root:
        shared = _inputs(Path(root))
        commands = list(HEADLINE) + ([] if args.only_headline else _corpus_args())
        sides = {"after": None} | ({"before": args.before} if args.before else {})
        rows = []
        for i, command in enumerate(commands):
            walls: dict[str, list[float]] = {s: [] for s in sides}
            cpus: dict[str, list[float]] = {s: [] for s in sides}
            last: dict[str, tuple[int, int]] = {}
            for _ in range(args.repeat):
                for side, path in (sides.items() if i % 2 == 0 else reversed(sides.items())):
                    wall, cpu, rc, lines = _one(command, shared, path)
                    walls[side].append(wall)
                    cpus[side].append(cpu)
                    last[side] = (rc, lines)
            row = {"command": command, "headline": command in HEADLINE}
            for side in sides:
                row[f"{side}_median_s"] = round(statistics.median(walls[side]), 3)
                row[f"{side}_cpu_median_s"] = round(statistics.median(cpus[side]), 3)
                row[f"{side}_exit"], row[f"{side}_stderr_lines"] = last[side]
            rows.append(row)
            print(f"{row['after_median_s']:6.2f} s (cpu {row['after_cpu_median_s']:5.2f} s)"
                  + (f" (before {row['before_median_s']:6.2f} s)" if args.before else "")
                  + f"  autoplan {command}", flush=True)
    corpus = [r for r in rows if not r["headline"]]
    summary = {"cases": len(corpus), "goal_s": GOAL_S,
               "after_under_goal": sum(r["after_median_s"] < GOAL_S for r in corpus),
               "after_max_s": max((r["after_median_s"] for r in corpus), default=None),
               "after_cpu_under_goal": sum(r["after_cpu_median_s"] < GOAL_S for r in corpus),
               "after_cpu_max_s": max((r["after_cpu_median_s"] for r in corpus), default=None),
               "after_median_of_medians_s": statistics.median(
                   [r["after_median_s"] for r in corpus]) if corpus else None}
    if args.before and corpus:
        summary["before_median_of_medians_s"] = statistics.median(
            [r["before_median_s"] for r in corpus])
    result = {"machine": machine_info() | {"load_avg_start": load_start,
                                           "load_avg": os.getloadavg()},
              "command": "python benchmarks/cli_latency.py " + " ".join(sys.argv[1:]),
              "repeat": args.repeat, "interleaved": bool(args.before),
              "before": "PYTHONPATH=" + Path(args.before).name if args.before else None,
              "summary": summary, "rows": rows}
    write_result(Path(args.out), result)
    print(summary)


if __name__ == "__main__":
    main()
