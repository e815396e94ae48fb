"""Llama-3.1-70B on one GPU: the bf16 baseline (141 GB) fits neither an H100 nor an H200;
FP8 does. What `estimate`, `fleet` and the search's preflight (which `search` and `compare`
run) answer for it at `--batch max`, an SLO and a fixed batch, all predicted by the cost
model from the bundled config (no weights needed):

    python benchmarks/baseline_unfit.py   -> benchmarks/results/baseline_unfit.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine_info, write_result  # noqa: E402

MODES = {"max": ["--batch", "max"], "slo": ["--ttft-ms", "2000", "--tpot-ms", "50"],
         "fixed": ["--batch", "4"]}
CONFIG = ROOT / "autoplan/data/configs/llama-3.1-70b.json"


def main() -> None:
    from click.testing import CliRunner

    from autoplan.backends.registry import resolve_target
    from autoplan.cli import cli
    from autoplan.cost import resolve_config
    from autoplan.cost.operating import OperatingRequest
    from autoplan.search import SearchRequest
    from autoplan.search.request import operating_point
    from autoplan.workload import Workload

    spec = resolve_config("llama-3.1-70b")
    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "fp8.json"
        plan.write_text(json.dumps({"decisions": {la.name: "dense+fp8_e4m3"
                                                  for la in spec.layers}}))
        for target in ("h100", "h200"):
            for mode, flags in MODES.items():
                est = CliRunner().invoke(cli, ["estimate", "--model", "llama-3.1-70b",
                                               "--target", target, "--precision", "fp8",
                                               *flags, "--json"])
                doc = json.loads(est.stdout)
                fleet = CliRunner().invoke(cli, ["fleet", "--plan", str(plan), "--model",
                                                 "llama-3.1-70b", "--node", target, "--qps",
                                                 "2", "--p99-ms", "60000", *flags, "--json"])
                fl = json.loads(fleet.stdout)
                op = {"max": OperatingRequest.parse("max", input_len=512, output_len=128),
                      "slo": OperatingRequest.parse(None, input_len=512, output_len=128,
                                                    ttft_ms=2000, tpot_ms=50),
                      "fixed": None}[mode]
                req = SearchRequest(model=str(CONFIG), target=target, operating=op,
                                    workload=Workload(batch=4, input_len=512, output_len=128))
                point, unfit = operating_point(req, resolve_target(target), "vllm")
                rows[f"{target}_{mode}"] = {
                    "estimate_exit": est.exit_code,
                    "fp8_batch": doc["candidate"]["workload"]["batch"],
                    "fp8_tokens_per_s": round(doc["candidate"]["metrics"]["throughput"], 1),
                    "baseline_status": doc["baseline"]["status"],
                    "baseline_needs_gb": round(doc["baseline"]["memory"]["total_bytes"] / 1e9,
                                               2),
                    "usable_gb": round(doc["candidate"]["memory"]["capacity_bytes"] / 1e9, 2),
                    "fleet_exit": fleet.exit_code, "fleet_plan_nodes": fl["plan"]["nodes"],
                    "fleet_baseline": fl["baseline"]["reason"],
                    "search_batch": point.workload.batch if point else 4,
                    "search_reference_format": unfit.reference if unfit else None,
                }
                print(target, mode, rows[f"{target}_{mode}"], flush=True)
    write_result(ROOT / "benchmarks/results/baseline_unfit.json",
                 {"machine": machine_info(), "command": "python benchmarks/baseline_unfit.py",
                  "predicted": True, "model": "llama-3.1-70b (bundled config)", "rows": rows})


if __name__ == "__main__":
    main()
