"""Quality of UNIFORM compression recipes on SmolLM2-135M: perplexity and KL to the original.

Every linear layer except lm_head (which stays dense fp32, as in the search space) gets the
same choice; lm_head and the embeddings are untouched. Masks (Wanda/SparseGPT) and GPTQ use
input statistics from `collect_stats` over the calibration blocks, taken once from the
original model. Quality is measured with `QualityEvaluator` on the held-out evaluation split
of the default text (CPython pydoc topics), with the same data settings `autoplan search`
uses (seq_len=256, calib_blocks=4 fed as split(2), eval_blocks=6, seed=0).

Wall time per recipe = compressing all layers (incl. GPTQ/SparseGPT solves) + one
evaluation pass; the shared statistics pass is timed once and reported separately.

Usage:
  python benchmarks/quality_table.py [--quick] [--eval-blocks 6] [--calib-blocks 4]
      [--seq-len 256] [--seed 0] [--out benchmarks/results/quality_table.json]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path


from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.text import load_text_dataset
from _common import seed_all, start_run, write_result  # noqa: E402 - benchmarks/ is the script dir

# (label, choice, prune_score, quant_method, weight/activation note)
RECIPES: list[tuple[str, str, str, str, str]] = [
    ("bf16 (reference rounding)", "dense+bf16", "wanda", "rtn", "W16A16"),
    ("fp8_e4m3", "dense+fp8_e4m3", "wanda", "rtn", "W8A8"),
    ("int8", "dense+int8", "wanda", "rtn", "W8A8"),
    ("int8_wo", "dense+int8_wo", "wanda", "rtn", "W8A16"),
    ("int4_g128 RTN", "dense+int4_g128", "wanda", "rtn", "W4A16"),
    ("int4_g128 GPTQ", "dense+int4_g128", "wanda", "gptq", "W4A16"),
    ("int4_g64 RTN", "dense+int4_g64", "wanda", "rtn", "W4A16"),
    ("int4_g64 GPTQ", "dense+int4_g64", "wanda", "gptq", "W4A16"),
    ("nvfp4", "dense+nvfp4", "wanda", "rtn", "W4A4"),
    ("mxfp4", "dense+mxfp4", "wanda", "rtn", "W4A4"),
    ("2:4 magnitude", "2:4+bf16", "magnitude", "rtn", "50% N:M, bf16"),
    ("2:4 Wanda", "2:4+bf16", "wanda", "rtn", "50% N:M, bf16"),
    ("2:4 SparseGPT", "2:4+bf16", "sparsegpt", "rtn", "50% N:M, bf16"),
    ("unstructured 50% Wanda", "unstructured@50+bf16", "wanda", "rtn", "50%, bf16"),
    ("block32 50% Wanda", "block32@50+bf16", "wanda", "rtn", "50% 32x32 blocks, bf16"),
]
QUICK = {"fp8_e4m3", "int4_g128 RTN", "int4_g128 GPTQ", "2:4 Wanda"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--calib-blocks", type=int, default=4)
    ap.add_argument("--eval-blocks", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: 2 eval blocks, recipes {sorted(QUICK)}")
    ap.add_argument("--out", default=None,
                    help="JSON output (default benchmarks/results/quality_table.json; "
                         "quality_table_quick.json with --quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.eval_blocks = min(args.eval_blocks, 2)
    out = Path(args.out or Path(__file__).parent / "results" /
               ("quality_table_quick.json" if args.quick else "quality_table.json"))
    t_all = time.perf_counter()
    info, command = start_run(args.seed, argv)

    loaded = load_model(args.model)
    model = loaded.model
    layers = [la.name for la in loaded.spec.layers if la.role != "lm_head"]
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=args.seq_len,
                             n_calib=args.calib_blocks, n_eval=args.eval_blocks, seed=args.seed)
    calib = list(data.calib.split(2))
    t0 = time.perf_counter()
    evaluator = QualityEvaluator(model, data.eval)
    ref_s = time.perf_counter() - t0
    print(f"model {loaded.model_id} ({loaded.content_hash[:12]}), {len(layers)} linear layers "
          f"compressed (lm_head dense fp32); eval {tuple(data.eval.shape)} tokens, "
          f"calib {tuple(data.calib.shape)}; reference ppl {evaluator.ppl_ref:.4f} ({ref_s:.1f}s)")
    t0 = time.perf_counter()
    stats = collect_stats(model, layers, calib)
    stats_s = time.perf_counter() - t0
    print(f"calibration statistics: {stats_s:.1f}s")

    rows = []
    for label, choice_text, score, method, note in RECIPES:
        if args.quick and label not in QUICK:
            continue
        seed_all(args.seed)
        choice = Choice.parse(choice_text)
        settings = CompressionSettings(prune_score=score, quant_method=method)
        t0 = time.perf_counter()
        compressed, swapped = compressed_copy(model, {n: choice for n in layers}, stats, settings)
        compress_s = time.perf_counter() - t0
        q = evaluator.evaluate(compressed)
        del compressed, swapped
        gc.collect()
        row = {"recipe": label, "choice": str(choice), "prune_score": score if
               choice.sparsity.kind != "dense" else None,
               "quant_method": method, "format": note,
               "bits_per_weight": choice.bits_per_weight(), "ppl": q.ppl, "ppl_ref": q.ppl_ref,
               "ppl_delta_pct": 100 * (q.ppl / q.ppl_ref - 1), "kl": q.kl,
               "compress_s": compress_s, "eval_s": q.seconds, "wall_s": compress_s + q.seconds}
        rows.append(row)
        print(f"  {label:26s} ppl {q.ppl:8.3f}  kl {q.kl:.5f}  "
              f"({compress_s:.1f}s compress + {q.seconds:.1f}s eval)", flush=True)

    total_s = time.perf_counter() - t_all
    table = [
        f"Reference (original, fp32): ppl {evaluator.ppl_ref:.3f} on {data.eval.numel()} "
        f"held-out tokens.",
        "",
        "| recipe | choice | format | bits/weight | ppl | Δppl | KL (nats/token) | wall s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        table.append(f"| {r['recipe']} | `{r['choice']}` | {r['format']} | "
                     f"{r['bits_per_weight']:.3g} | {r['ppl']:.3f} | {r['ppl_delta_pct']:+.1f}% | "
                     f"{r['kl']:.4g} | {r['wall_s']:.1f} |")
    print()
    print("\n".join(table))
    print(f"\nshared calibration statistics pass: {stats_s:.1f}s; total wall time {total_s:.0f}s")
    result = {
        "benchmark": "quality_table", "command": command, "machine": info,
        "model": {"id": loaded.model_id, "content_hash": loaded.content_hash},
        "data": {"source": data.source, "content_hash": data.content_hash,
                 "seq_len": args.seq_len, "calib_blocks": args.calib_blocks,
                 "eval_blocks": args.eval_blocks, "eval_tokens": int(data.eval.numel()),
                 "seed": args.seed},
        "ppl_ref": evaluator.ppl_ref, "compressed_layers": len(layers),
        "stats_s": stats_s, "reference_s": ref_s, "total_s": total_s, "quick": args.quick,
        "rows": rows, "markdown": "\n".join(table),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
