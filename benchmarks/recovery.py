"""Recovery after compression on SmolLM2-135M: the 2:4 goal and the ablation table.

  goal      uniform 2:4 SparseGPT (bf16; every linear but lm_head): KL to the original
            before and after a distillation pass (weights under their masks, re-quantized),
            wall and process CPU time of the pass, load average before and after.
  ablation  unstructured 50 % / block32 25 % / 2:4 (Wanda masks; 2:4 also SparseGPT) x
            {bf16, fp8_e4m3, int8} x {no recovery, distill}: KL, KL per slice, the
            long-context score (passkey, lengths up to --longctx-max) and one lm-eval task
            (benchmarks/lmeval_tasks/autoplan_geo_mc: 200 factual-recall questions built
            from pycountry, offline), each beside the original's.

Data as `autoplan search` uses it (pydoc text, seq_len 256, 4 calibration blocks fed as
split(2), 6 held-out evaluation blocks, seed 0); recovery trains on the calibration split
(--recover-blocks blocks of 256 tokens), never on the evaluation blocks.

Usage:
  python benchmarks/recovery.py goal [--steps 150] [--lr 1e-4]
  python benchmarks/recovery.py ablation [--steps 60] [--rows 2:4+bf16/sparsegpt,...]
      [--longctx-max 2048] [--lm-eval-limit N]
  python benchmarks/recovery.py table [--out recovery_ablation.json]   # its markdown table
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import torch
from _common import start_run, write_result  # noqa: E402 - benchmarks/ is the script dir

from autoplan.compress import CompressionSettings, collect_stats, compressed_copy, recompress_linear
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.models.graph import get_linear, set_module
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.slices import build_slices
from autoplan.quality.text import load_text_dataset
from autoplan.recover import RecoverySettings, recover
from autoplan.search.recovery import recovery_text

HERE = Path(__file__).parent
TASKS = HERE / "lmeval_tasks"
# (choice, prune score): every linear but lm_head gets the choice
ABLATION = [(f"{sp}+{p}", score) for sp, score in (("unstructured@50", "wanda"),
                                                     ("block32@25", "wanda"),
                                                     ("2:4", "wanda"), ("2:4", "sparsegpt"))
            for p in ("bf16", "fp8_e4m3", "int8")]


def load_avg() -> float:
    return os.getloadavg()[0]


def quality(evaluator: QualityEvaluator, model: torch.nn.Module) -> dict:
    q = evaluator.evaluate(model)
    return {"kl": q.kl, "ppl": q.ppl, "slices": q.slices,
            "gates": {k: {"score": g.score, "reference": g.reference, "detail": g.detail}
                      for k, g in q.gates.items()}, "seconds": q.seconds}


def requantized(model, swapped, weights, stats, settings):  # noqa: ANN001, ANN201
    out = copy.deepcopy(model)
    for name, w in weights.items():
        sim = swapped[name]
        set_module(out, name, recompress_linear(get_linear(model, name), sim.choice, sim.mask,
                                                w, stats.get(name) if stats else None,
                                                settings))
    return out


def recovered(model, compressed, swapped, stats, settings, rs, text, log,  # noqa: ANN001
              evaluate_at=(), on_eval=None) -> tuple:  # noqa: ANN001
    """Train; at the steps in ``evaluate_at``, measure the model re-quantized so far."""
    t0, c0, la0 = time.perf_counter(), time.process_time(), load_avg()
    curve = []

    def step(done: int, total: int, loss: float) -> None:
        log(done, total, loss, t0)
        if done in evaluate_at and done < total:
            weights = {n: (compressed.get_submodule(n).weight.detach() *
                           compressed.get_submodule(n).mask) for n in swapped}
            kl = on_eval(requantized(model, swapped, weights, stats, settings))
            curve.append({"step": done, "kl": kl, "wall_s": time.perf_counter() - t0,
                          "cpu_s": time.process_time() - c0, "load_avg": load_avg()})
            print(f"  step {done}: KL {kl:.4f}", flush=True)

    res = recover(compressed, model, swapped, text.blocks, rs, run_key="benchmark",
                  on_step=step)
    out = requantized(model, swapped, res.weights, stats, settings)
    info = {"steps": len(res.losses), "loss_first": res.losses[0], "loss_last": res.losses[-1],
            "losses": res.losses, "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0, "load_avg_before": la0,
            "load_avg_after": load_avg(), "curve": curve}
    return out, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("goal", "ablation", "table"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--recover-blocks", type=int, default=256)
    ap.add_argument("--longctx-max", type=int, default=2048)
    ap.add_argument("--lm-eval-limit", type=int, default=None,
                    help="ablation: the lm-eval task's first N questions (default: all 200)")
    ap.add_argument("--rows", default=None, help="ablation: comma-separated 'choice/score'")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--evaluate-every", type=int, default=25,
                    help="goal: measure the re-quantized model every N steps (a KL curve)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.mode == "table":
        import json

        path = Path(args.out or HERE / "results" / "recovery_ablation.json")
        print(ablation_table(json.loads(path.read_text())))
        return 0
    steps = args.steps or (150 if args.mode == "goal" else 60)
    info, command = start_run(args.seed, argv)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    layers = [la.name for la in loaded.spec.layers if la.role != "lm_head"]
    data = load_text_dataset(None, tokenizer=tok, seq_len=256, n_calib=4, n_eval=6,
                             seed=args.seed)
    calib = list(data.calib.split(2))
    stats = collect_stats(model, layers, calib)
    rs = RecoverySettings(steps=steps, lr=args.lr, max_blocks=args.recover_blocks,
                          batch=args.batch, seed=args.seed, checkpoint_every=0)
    text = recovery_text(rs, tok)
    gates = []
    if args.mode == "ablation":
        from autoplan.quality.lmeval import LmEvalGate
        from autoplan.quality.longctx import LongContextGate

        gates = [LongContextGate(tok, model, max_len=args.longctx_max),
                 LmEvalGate("autoplan_geo_mc", tok, include_path=TASKS,
                            limit=args.lm_eval_limit)]
    evaluator = QualityEvaluator(model, data.eval, slices=build_slices(tok), gates=gates)
    reference = {k: v[0] for k, v in evaluator.gate_references.items()}
    print(f"reference: ppl {evaluator.ppl_ref:.3f}, gates {reference}", flush=True)

    def log(done: int, total: int, loss: float, t0: float) -> None:
        if done == 1 or done % 10 == 0 or done == total:
            print(f"  step {done}/{total} loss {loss:.4f} {time.perf_counter() - t0:.0f} s "
                  f"load {load_avg():.1f}", flush=True)

    name = "recovery.json" if args.mode == "goal" else "recovery_ablation.json"
    out_path = Path(args.out or HERE / "results" / name)
    head = {"machine": info, "command": command, "model": loaded.model_id,
            "settings": rs.to_dict(), "ppl_ref": evaluator.ppl_ref,
            "gate_reference": reference,
            "gate_reference_detail": {k: v[1] for k, v in evaluator.gate_references.items()}}
    rows = ABLATION if args.mode == "ablation" else [("2:4+bf16", "sparsegpt")]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if f"{r[0]}/{r[1]}" in wanted]
    results = []
    for choice_text, score in rows:
        settings = CompressionSettings(score, "rtn")
        choice = Choice.parse(choice_text)
        t0 = time.perf_counter()
        compressed, swapped = compressed_copy(model, {n: choice for n in layers}, stats, settings)
        row = {"choice": choice_text, "prune_score": score,
               "compress_s": time.perf_counter() - t0, "before": quality(evaluator, compressed)}
        print(f"{choice_text} {score}: KL {row['before']['kl']:.4f}", flush=True)
        every = args.evaluate_every if args.mode == "goal" else 0
        at = set(range(every, steps, every)) if every else set()

        def partial(m, row=row):  # noqa: ANN001, ANN202 - write what is measured so far
            kl = evaluator.evaluate(m).kl
            write_result(out_path.with_suffix(".partial.json"), {**head, "rows": [*results, row]})
            return kl

        out, row["recovery"] = recovered(model, compressed, swapped, stats, settings, rs, text,
                                         log, at, partial)
        row["after"] = quality(evaluator, out)
        print(f"  after {steps} steps: KL {row['after']['kl']:.4f} "
              f"({row['recovery']['wall_s']:.0f} s wall, {row['recovery']['cpu_s']:.0f} s CPU)",
              flush=True)
        results.append(row)
        write_result(out_path.with_suffix(".partial.json"), {**head, "rows": results})
        del compressed, swapped, out
    write_result(out_path, {**head, "rows": results})
    out_path.with_suffix(".partial.json").unlink(missing_ok=True)
    if args.mode == "ablation":
        print(ablation_table({**head, "rows": results}))
    return 0


def ablation_table(doc: dict) -> str:
    """One markdown row per (choice, prune score): before -> after recovery for KL, each
    slice's KL, the long-context score and accuracy, and the lm-eval task's accuracy."""
    ref = doc["gate_reference"]
    task = next(k for k in ref if k.startswith("lm-eval:"))
    slices = sorted(doc["rows"][0]["before"]["slices"]) if doc["rows"] else []
    head = (["choice (every linear but lm_head)", "masks", "KL"]
            + [f"KL {s}" for s in slices]
            + ["long-context score (acc %)", f"{task.split(':')[1]} acc %", "ppl"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    acc = doc.get("gate_reference_detail", {}).get("longctx", {}).get("accuracy")
    lc_ref = f"{ref['longctx']:.1f}" + (f" ({acc:.0f})" if acc is not None else "")
    lines.append("| original | - | 0 | " + " | ".join("0" for _ in slices)
                 + f" | {lc_ref} | {ref[task]:.0f} | {doc['ppl_ref']:.2f} |")

    def both(row: dict, get) -> str:  # noqa: ANN001 - "before -> after"
        return f"{get(row['before'])} -> {get(row['after'])}"

    for r in doc["rows"]:
        cells = [r["choice"], r["prune_score"], both(r, lambda q: f"{q['kl']:.3f}")]
        cells += [both(r, lambda q, s=s: f"{q['slices'][s]:.2f}") for s in slices]
        lc = r["before"]["gates"]["longctx"], r["after"]["gates"]["longctx"]
        cells.append(f"{lc[0]['score']:.1f} ({lc[0]['detail']['accuracy']:.0f}) -> "
                     f"{lc[1]['score']:.1f} ({lc[1]['detail']['accuracy']:.0f})")
        cells.append(both(r, lambda q: f"{q['gates'][task]['score']:.0f}"))
        cells.append(both(r, lambda q: f"{q['ppl']:.1f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
