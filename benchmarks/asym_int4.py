"""Asymmetric INT4 (uint4 zero points) vs symmetric INT4 on ONNX Runtime's int8-compute path.

Two measurements, side by side in one run:

1. Quality: KL to the original on SmolLM2-135M with EVERY linear layer (lm_head included, as
   the `uniform-int4a8` side of the CPU bench) in one format: int4a8_gN (symmetric, codes
   -8..7) vs uint4a8_gN (codes 0..15 with a uint4 zero point per group), N = 32 and 128,
   rounded to nearest (RTN) and by GPTQ. The same data settings as `autoplan search`
   (seq_len 256, 4 calibration blocks fed as split(2), 6 held-out evaluation blocks, seed 0);
   the simulation is the one whose numerics tests/unit/test_onnx_export.py checks against
   ORT node by node.
2. Speed: one MatMulNBits GEMV (m = 1) at accuracy_level 4, symmetric vs with packed uint4
   zero points, on a 576x1536 (down_proj) and a 1536x576 (gate/up) layer, timed by
   backends/cpu/ort_microbench.time_row (weights streamed from DRAM, caches flushed).
   Rounds interleave the formats; every round records os.getloadavg(); medians over rounds.

Usage:
  python benchmarks/asym_int4.py [--rounds 7] [--no-quality] [--no-speed]
      [--out benchmarks/results/asym_int4.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

from _common import seed_all, start_run, write_result  # noqa: E402 - benchmarks/ is the script dir

FORMATS = ("int4a8_g32", "uint4a8_g32", "int4a8_g128", "uint4a8_g128")
SHAPES = ((576, 1536), (1536, 576))  # (out, in): down_proj, gate/up of SmolLM2-135M


def quality(args: argparse.Namespace) -> list[dict]:
    from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
    from autoplan.formats import Choice
    from autoplan.models import load_model
    from autoplan.quality.evaluator import QualityEvaluator
    from autoplan.quality.text import load_text_dataset

    loaded = load_model(args.model)
    layers = [la.name for la in loaded.spec.layers]
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=4,
                             n_eval=6, seed=args.seed)
    evaluator = QualityEvaluator(loaded.model, data.eval)
    stats = collect_stats(loaded.model, layers, list(data.calib.split(2)))
    print(f"{len(layers)} linear layers (lm_head included); reference ppl "
          f"{evaluator.ppl_ref:.3f} on {data.eval.numel()} held-out tokens", flush=True)
    rows = []
    for method in ("rtn", "gptq"):
        for fmt in FORMATS:
            seed_all(args.seed)
            choice = Choice.parse(fmt)
            t0 = time.perf_counter()
            model, _ = compressed_copy(loaded.model, {n: choice for n in layers}, stats,
                                       CompressionSettings(quant_method=method))
            compress_s = time.perf_counter() - t0
            q = evaluator.evaluate(model)
            del model
            gc.collect()
            rows.append({"format": fmt, "method": method, "kl": q.kl, "ppl": q.ppl,
                         "ppl_ref": q.ppl_ref, "bits_per_weight": choice.bits_per_weight(),
                         "compress_s": compress_s, "eval_s": q.seconds,
                         "loadavg_1m": os.getloadavg()[0]})
            print(f"  {method:4s} {fmt:13s} KL {q.kl:.4f}  ppl {q.ppl:.3f}  "
                  f"({compress_s:.0f}s + {q.seconds:.0f}s, load {os.getloadavg()[0]:.2f})",
                  flush=True)
    return rows


def speed(args: argparse.Namespace) -> dict:
    from autoplan.backends.cpu.ort_microbench import time_row

    samples: dict[str, list[float]] = {}
    loads: list[float] = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for out_f, in_f in SHAPES:
            for fmt in FORMATS:
                row = time_row(1, out_f, in_f, fmt, threads=args.threads)
                samples.setdefault(f"{out_f}x{in_f} {fmt}", []).append(row["median_us"])
        print(f"  round {r + 1}/{args.rounds} done (load {loads[-1]:.2f})", flush=True)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"rounds": args.rounds, "threads": args.threads, "loadavg_1m_per_round": loads,
            "samples_us": samples, "median_us": medians}


def markdown(rows: list[dict], timing: dict | None) -> str:
    lines = []
    if rows:
        by = {(r["format"], r["method"]): r for r in rows}
        lines += ["| format | bits/weight | KL RTN | KL GPTQ | ppl RTN | ppl GPTQ |",
                  "|---|---:|---:|---:|---:|---:|"]
        for fmt in FORMATS:
            rtn, gptq = by.get((fmt, "rtn")), by.get((fmt, "gptq"))
            if rtn and gptq:
                lines.append(f"| {fmt} | {rtn['bits_per_weight']:.4g} | {rtn['kl']:.4f} | "
                             f"{gptq['kl']:.4f} | {rtn['ppl']:.3f} | {gptq['ppl']:.3f} |")
        lines.append("")
    if timing:
        med = timing["median_us"]
        lines += ["| layer [out x in], m=1, level 4 | group | symmetric us | zero points us | "
                  "zp / sym |", "|---|---:|---:|---:|---:|"]
        for out_f, in_f in SHAPES:
            for g in (32, 128):
                sym = med[f"{out_f}x{in_f} int4a8_g{g}"]
                asym = med[f"{out_f}x{in_f} uint4a8_g{g}"]
                lines.append(f"| {out_f} x {in_f} | {g} | {sym:.1f} | {asym:.1f} | "
                             f"{asym / sym:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="ORT threads (default physical cores)")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "asym_int4.json"))
    args = ap.parse_args(argv)
    info, command = start_run(args.seed, argv)

    t0 = time.perf_counter()
    timing = None if args.no_speed else speed(args)
    rows = [] if args.no_quality else quality(args)
    table = markdown(rows, timing)
    print()
    print(table)
    write_result(Path(args.out), {
        "benchmark": "asym_int4", "command": command, "machine": info, "model": args.model,
        "quality": rows, "speed": timing, "markdown": table,
        "total_s": time.perf_counter() - t0})
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
