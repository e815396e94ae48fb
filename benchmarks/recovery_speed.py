"""Decode speed a plan's per-layer choice pattern predicts for an 8B-shaped model on H100.

The plan's decisions are mapped onto Llama-3.1-8B's layers by role (q/k/v/o/gate/up/down)
and relative depth (block / (blocks - 1), nearest plan block), then the cost model
(`autoplan.cost.model.CostModel`, PREDICTED, not measured) gives the decode time per output
token (TPOT) of: the mapped pattern, the same pattern with every 2:4 layer dense in its own
precision (the 2:4 effect alone), and the bf16 baseline.

Usage:
  python benchmarks/recovery_speed.py PLAN.json [--target h100-sxm] [--batch 32]
      [--input-len 512] [--output-len 128] [--out benchmarks/results/recovery_speed.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import start_run, write_result  # noqa: E402 - benchmarks/ is the script dir

from autoplan.cost.configs import resolve_config
from autoplan.cost.model import CostModel
from autoplan.formats import DENSE, Choice
from autoplan.modelspec import ModelSpec
from autoplan.plan.io import load_plan
from autoplan.targets import get_target
from autoplan.workload import Workload


def mapped(plan_decisions: dict[str, str], plan_blocks: int, spec: ModelSpec) -> dict[str, Choice]:
    """The plan's choices on ``spec``'s layers, by role and nearest relative depth."""
    by_role: dict[tuple[str, int], Choice] = {}
    roles = {}
    for name, text in plan_decisions.items():
        parts = name.split(".")
        if "layers" not in parts:
            continue
        block = int(parts[parts.index("layers") + 1])
        by_role[(parts[-1], block)] = Choice.parse(text)
        roles[parts[-1]] = True
    out = {}
    for layer in spec.layers:
        if layer.block < 0:
            continue
        role = layer.name.split(".")[-1]
        if role not in roles:
            continue
        depth = layer.block / max(1, spec.n_layers - 1)
        src = round(depth * max(1, plan_blocks - 1))
        choice = by_role.get((role, src))
        if choice is not None:
            out[layer.name] = choice
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--target", default="h100-sxm")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "recovery_speed.json"))
    args = ap.parse_args(argv)
    info, command = start_run(0, argv)
    plan = load_plan(args.plan)
    spec = resolve_config(args.model)
    cost = CostModel(spec, get_target(args.target),
                     Workload(batch=args.batch, input_len=args.input_len,
                              output_len=args.output_len))
    pattern = mapped(plan.decisions, plan.model.n_layers, spec)
    no24 = {n: Choice(DENSE, c.precision) if c.sparsity.kind == "nm" else c
            for n, c in pattern.items()}
    tpot = {k: cost.evaluate(d).metrics.tpot_s for k, d in
            (("pattern", pattern), ("pattern_without_2:4", no24), ("baseline", {}))}
    n24 = sum(c.sparsity.kind == "nm" for c in pattern.values())
    doc = {"machine": info, "command": command, "plan": Path(args.plan).name,
           "model": args.model, "target": args.target,
           "workload": {"batch": args.batch, "input_len": args.input_len,
                        "output_len": args.output_len},
           "layers_2_4": n24, "layers": len(pattern), "tpot_s": tpot,
           "decode_speedup_of_2_4": tpot["pattern_without_2:4"] / tpot["pattern"],
           "decode_speedup_vs_baseline": tpot["baseline"] / tpot["pattern"],
           "note": "cost-model predictions, not measurements"}
    print(json.dumps({k: v for k, v in doc.items() if k not in ("machine",)}, indent=1))
    write_result(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
