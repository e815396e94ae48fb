"""Cost-model validation: predicted vs published speedup ratios (`autoplan validate`).

Runs the same computation as `autoplan validate --json` (autoplan.cost.validate) over every
point of autoplan/data/measurements.toml and writes it with the machine, the command and the
load average. The figures are predictions of the analytic model compared with published
measurements; nothing is timed, so the machine and its load do not change them (recorded
only so the results file says where it was made, like every other one).

Reported: MAPE over all evaluated points, in sample (points in view when the efficiency
constants were set), out of sample (`tuned = false`), leave-one-family-out (each in-sample
point with its families' constants replaced by the median of the other families), and the
MAPE per source.

Usage:
  python benchmarks/cost_validation.py [--out benchmarks/results/cost_validation.json]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402

from autoplan.cost.validate import validate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/cost_validation.json")
    args = parser.parse_args(argv)
    info, command = start_run(0, argv)
    load_before = os.getloadavg()[0]
    report = validate()
    doc = report.to_json()
    print(f"MAPE {doc['mape']:.1%} over {doc['evaluated']} points; in sample "
          f"{doc['mape_in_sample']:.1%} ({doc['in_sample']}), out of sample "
          f"{doc['mape_out_of_sample']:.1%} ({doc['out_of_sample']}); leave-one-family-out "
          f"{doc['mape_lofo']:.1%}")
    for source, mape in doc["mape_by_source"].items():
        print(f"  {source:14s} {mape:.1%}")
    write_result(args.out, {"what": "cost model vs published speedup ratios (predicted)",
                            "machine": info, "command": command,
                            "loadavg_1m": [load_before, os.getloadavg()[0]], **doc})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
