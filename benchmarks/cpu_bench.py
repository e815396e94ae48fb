"""CPU decode benchmark on SmolLM2-135M: FP32 ONNX vs INT8 plan vs INT4 plan (+ PyTorch eager).

All ONNX sides run in the same runtime (ONNX Runtime, physical-core threads), interleaved
batch by batch in one process (autoplan.bench.run_bench), so machine noise hits every side
alike. Plans are uniform over every linear layer including the tied lm_head (576 x 49152,
a fifth of the linear weights); the embedding gather stays fp32 (it reads one row a token).

Goals checked and printed (never asserted: this is a measurement, not a test):
  INT8 decode >= 2x FP32, INT4 decode >= 3x FP32 (same runtime),
  decode >= 50% of the bandwidth roofline: tok/s / (measured read bandwidth / bytes streamed
  per token), bytes streamed = all initializers except the gathered embedding table.

Usage:
  python benchmarks/cpu_bench.py [--requests 8] [--input-len 128] [--output-len 64]
      [--int4 int4_g32] [--int4-accuracy-level 4] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from autoplan.backends.cpu.onnx_export import export_cpu_model
from autoplan.bench import ort_side, read_bandwidth, run_bench, torch_side
from autoplan.formats import Choice
from autoplan.plan import write_json_atomic

GOALS = {"int8": 2.0, "int4": 3.0}
ROOFLINE_GOAL = 0.5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--int4", default="int4_g32", help="int4 format: int4_g32/g64/g128")
    ap.add_argument("--int4-accuracy-level", type=int, default=4, choices=(0, 1, 4),
                    help="MatMulNBits compute: 4 = int8 math (fast), 0 = fp32 (exact W4A16)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=None, help="write the JSON report here (atomically)")
    args = ap.parse_args(argv)

    from autoplan.models import load_model

    loaded = load_model(args.model)
    layers = [layer.name for layer in loaded.spec.layers]
    plans = {"baseline": ({}, 0),
             "int8": ({n: Choice.parse("int8") for n in layers}, 0),
             "int4": ({n: Choice.parse(args.int4) for n in layers}, args.int4_accuracy_level)}
    with tempfile.TemporaryDirectory(prefix="cpu-bench-") as tmp:
        sides = []
        for name, (decisions, level) in plans.items():
            art = export_cpu_model(loaded.model, loaded.tokenizer, decisions, Path(tmp) / name,
                                   accuracy_level=level)
            sides.append(ort_side(name, art, args.threads))
        if not args.no_torch:
            sides.append(torch_side(loaded.model, args.threads))
        bandwidth = read_bandwidth(threads=args.threads)
        report = run_bench(sides, requests=args.requests, concurrency=args.concurrency,
                           input_len=args.input_len, output_len=args.output_len,
                           vocab=loaded.spec.vocab, bandwidth=bandwidth, threads=args.threads,
                           progress=lambda m: print(m, file=sys.stderr))
    doc = report.to_json()
    doc["config"] = {**vars(args), "int4_format": args.int4}
    _print(report, doc, args)
    if args.out:
        write_json_atomic(args.out, doc)
    return 0


def _print(report, doc: dict, args: argparse.Namespace) -> None:
    print(f"\n{args.model}: {args.requests} requests x {args.input_len} in / {args.output_len} "
          f"out, concurrency {args.concurrency}, {report.threads} threads, read bandwidth "
          f"{report.bandwidth_gbps:.1f} GB/s (measured)")
    head = f"{'side':<20}{'decode tok/s':>14}{'prefill tok/s':>15}{'TTFT p50 ms':>13}" \
           f"{'TPOT p50 ms':>13}{'MB/token':>10}{'roofline':>10}{'vs fp32':>9}"
    print(head)
    ratios = doc.get("ratios_vs_baseline", {})
    for s in report.sides:
        ratio = 1.0 if s.name == "baseline" else ratios[s.name]["decode_tok_s"]
        roof = "-" if s.roofline_fraction is None else f"{s.roofline_fraction:.0%}"
        streamed = "-" if s.streamed_mb is None else f"{s.streamed_mb:.0f}"
        print(f"{s.name:<20}{s.decode_tok_s:>14.1f}{s.prefill_tok_s:>15.0f}"
              f"{s.ttft_ms['p50']:>13.1f}{s.tpot_ms['p50']:>13.2f}{streamed:>10}{roof:>10}"
              f"{ratio:>8.2f}x")
    for name, goal in GOALS.items():
        got = ratios[name]["decode_tok_s"]
        print(f"goal {name} decode >= {goal:.0f}x fp32: {got:.2f}x "
              f"{'MET' if got >= goal else 'NOT MET'}")
    for s in report.sides:
        if s.roofline_fraction is not None:
            ok = "MET" if s.roofline_fraction >= ROOFLINE_GOAL else "NOT MET"
            print(f"goal {s.name} decode >= {ROOFLINE_GOAL:.0%} of roofline: "
                  f"{s.roofline_fraction:.0%} {ok}")


if __name__ == "__main__":
    sys.exit(main())
