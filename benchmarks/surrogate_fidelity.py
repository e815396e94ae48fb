"""Fidelity of the additive quality surrogate: predicted vs measured KL of random mixed plans.

The search constrains surrogate(plan) = sum over compressed layers of the sensitivity
profile's score(layer, choice) (KL nats/token, `autoplan.sensitivity.build_profile`). This
script builds the profile exactly as `autoplan search` does (seq_len=256, calib_blocks=4 fed
as split(2), seed=0, Wanda masks, RTN) for the decision units of SmolLM2-135M on
b200 x tensorrt-llm (fused q/k/v, o, fused gate/up, down per block; lm_head protected),
whose runtime matrix offers exactly the 8 choices fp8_e4m3, int8, int8_wo, int4_g64,
int4_g128, nvfp4, 2:4+bf16 and 2:4+fp8_e4m3 besides the dense bf16 baseline.

It then draws random MIXED plans: plan i compresses a fraction f_i of the 120 units
(f log-spaced from --min-fraction to 1, plan order shuffled), each compressed unit drawing
its choice from a per-plan Dirichlet(0.7) mixture over the 8 choices, so plans range from a
few cheap layers to everything at 2:4. Every plan is applied to the real model and its KL to
the original measured with `QualityEvaluator` on the held-out split (eval_blocks=6), exactly
what the search's verification step does. Units left at the baseline stay at the original
fp32 weights (the baseline scores 0 in the surrogate, as in `search.tables`).

Compressed layers are computed once per (layer, choice) and swapped into one working copy
of the model (compression is deterministic, so this equals `compressed_copy`; the script
checks it on the first plan against a fresh `compressed_copy`).

Reported (scipy.stats): Spearman rank correlation (goal >= 0.9), Pearson on raw and on
log10 values, Kendall tau, the calibration slope (measured ~ slope x surrogate, least squares
through the origin), the median and max of measured/surrogate, over all plans and over the
budget-relevant ranges surrogate <= 0.1 and measured <= 0.1.

Usage:
  python benchmarks/surrogate_fidelity.py [--quick] [--plans 32] [--seed 0]
      [--profile-cache DIR] [--out benchmarks/results/surrogate_fidelity.json]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats as sps

from autoplan.compress import CompressionSettings, collect_stats, compress_linear, compressed_copy
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.models.graph import get_linear, set_module
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.text import load_text_dataset
from autoplan.search import build_space
from autoplan.sensitivity import build_profile
from autoplan.targets import get_target
from _common import start_run, write_result  # noqa: E402 - benchmarks/ is the script dir

CHOICES = ["dense+fp8_e4m3", "dense+int8", "dense+int8_wo", "dense+int4_g64",
           "dense+int4_g128", "dense+nvfp4", "2:4+bf16", "2:4+fp8_e4m3"]
DIRICHLET_ALPHA = 0.7


def draw_plans(units, n: int, min_fraction: float, seed: int) -> list[dict[str, Choice]]:
    """n random mixed plans (unit name -> choice; absent = baseline), deterministic in seed."""
    rng = np.random.default_rng(seed)
    fractions = np.exp(np.linspace(math.log(min_fraction), 0.0, n))
    rng.shuffle(fractions)
    plans = []
    for f in fractions:
        k = max(1, int(round(f * len(units))))
        picked = rng.choice(len(units), size=k, replace=False)
        weights = rng.dirichlet([DIRICHLET_ALPHA] * len(CHOICES))
        plan = {}
        for u in sorted(picked):
            allowed = [i for i, c in enumerate(CHOICES) if Choice.parse(c) in units[u].choices]
            w = weights[allowed] / weights[allowed].sum()
            plan[units[u].name] = Choice.parse(CHOICES[allowed[rng.choice(len(allowed), p=w)]])
        plans.append(plan)
    return plans


def correlations(sur: np.ndarray, meas: np.ndarray) -> dict:
    n = len(sur)
    out: dict = {"n": int(n)}
    if n < 3:
        return out
    pos = (sur > 0) & (meas > 0)
    out["spearman"] = float(sps.spearmanr(sur, meas).statistic)
    out["kendall_tau"] = float(sps.kendalltau(sur, meas).statistic)
    out["pearson"] = float(sps.pearsonr(sur, meas).statistic)
    out["pearson_log10"] = float(sps.pearsonr(np.log10(sur[pos]), np.log10(meas[pos])).statistic)
    out["slope_ls_origin"] = float((sur * meas).sum() / (sur * sur).sum())
    ratio = meas[pos] / sur[pos]
    out["ratio_median"] = float(np.median(ratio))
    out["ratio_min"] = float(ratio.min())
    out["ratio_max"] = float(ratio.max())
    out["surrogate_range"] = [float(sur.min()), float(sur.max())]
    out["measured_range"] = [float(meas.min()), float(meas.max())]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--target", default="b200")
    ap.add_argument("--runtime", default="tensorrt-llm")
    ap.add_argument("--plans", type=int, default=32)
    ap.add_argument("--min-fraction", type=float, default=0.01,
                    help="smallest fraction of units a plan compresses")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--calib-blocks", type=int, default=4)
    ap.add_argument("--eval-blocks", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0,
                    help="data/profile seed (as the search's --seed) and plan-drawing seed")
    ap.add_argument("--prune-score", default="wanda")
    ap.add_argument("--quant-method", default="rtn")
    ap.add_argument("--profile-cache", default=None,
                    help="profile cache folder to reuse (default: a fresh temporary folder, "
                         "so the profiling time is measured)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 8 plans, 2 eval blocks")
    ap.add_argument("--out", default=None,
                    help="JSON output (default benchmarks/results/surrogate_fidelity.json; "
                         "surrogate_fidelity_quick.json with --quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.plans = min(args.plans, 8)
        args.eval_blocks = min(args.eval_blocks, 2)
    out = Path(args.out or Path(__file__).parent / "results" /
               ("surrogate_fidelity_quick.json" if args.quick else "surrogate_fidelity.json"))
    t_all = time.perf_counter()
    info, command = start_run(args.seed, argv)

    loaded = load_model(args.model)
    model = loaded.model
    settings = CompressionSettings(args.prune_score, args.quant_method)
    space = build_space(loaded.spec, get_target(args.target), args.runtime)
    offered = {str(c) for c in space.all_choices if c != space.baseline}
    missing = set(CHOICES) - offered
    if missing:
        raise SystemExit(f"{args.target} x {args.runtime} does not offer {sorted(missing)}")
    choices = [Choice.parse(c) for c in CHOICES]
    units = list(space.units)
    layers = [la.name for u in units for la in u.layers]
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=args.seq_len,
                             n_calib=args.calib_blocks, n_eval=args.eval_blocks, seed=args.seed)
    calib = list(data.calib.split(2))
    print(f"space {space.target} x {space.runtime}: {len(units)} units, {len(layers)} layers, "
          f"baseline {space.baseline}, protected {[la.name for la in space.protected]}")

    # 1. the sensitivity profile, as run_search builds it
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autoplan-fidelity-") as tmp:
        cache = Path(args.profile_cache) if args.profile_cache else Path(tmp)
        profile = build_profile(model, layers, choices, calib, model_hash=loaded.content_hash,
                                calib_hash=data.content_hash, settings=settings,
                                cache_dir=cache, seed=args.seed)
    profile_s = time.perf_counter() - t0
    print(f"profile: {len(layers)} layers x {len(choices)} choices in {profile_s:.0f}s "
          f"({profile.tokens} calibration tokens)", flush=True)

    def surrogate(plan: dict[str, Choice]) -> float:
        return sum(profile.cost(la.name, plan[u.name]) for u in units if u.name in plan
                   for la in u.layers)

    # 2. the real measurement
    t0 = time.perf_counter()
    evaluator = QualityEvaluator(model, data.eval)
    stats = collect_stats(model, layers, calib)
    setup_s = time.perf_counter() - t0
    print(f"reference pass + calibration statistics: {setup_s:.0f}s; "
          f"reference ppl {evaluator.ppl_ref:.4f} on {data.eval.numel()} tokens", flush=True)

    originals = {n: get_linear(model, n) for n in layers}
    work = compressed_copy(model, {}, None, settings)[0]  # a deep copy to swap layers into
    sims: dict[tuple[str, Choice], torch.nn.Module] = {}

    def apply(plan: dict[str, Choice]) -> None:
        for u in units:
            choice = plan.get(u.name)
            for la in u.layers:
                if choice is None:
                    set_module(work, la.name, get_linear(model, la.name))
                    continue
                key = (la.name, choice)
                if key not in sims:
                    sims[key] = compress_linear(originals[la.name], choice, stats[la.name],
                                                settings)
                set_module(work, la.name, sims[key])

    plans = draw_plans(units, args.plans, args.min_fraction, args.seed)
    rows = []
    check = None
    for i, plan in enumerate(plans):
        t0 = time.perf_counter()
        apply(plan)
        q = evaluator.evaluate(work)
        counts: dict[str, int] = {}
        for c in plan.values():
            counts[str(c)] = counts.get(str(c), 0) + 1
        row = {"plan": i, "units_compressed": len(plan), "choices": counts,
               "surrogate_kl": surrogate(plan), "measured_kl": q.kl, "ppl": q.ppl,
               "seconds": time.perf_counter() - t0,
               "decisions": {u: str(c) for u, c in plan.items()}}
        rows.append(row)
        print(f"  plan {i:2d}: {len(plan):3d}/{len(units)} units  surrogate {row['surrogate_kl']:.4g}"
              f"  measured {q.kl:.4g}  ratio {q.kl / max(row['surrogate_kl'], 1e-12):.3f}"
              f"  ({row['seconds']:.0f}s)", flush=True)
        if i == 0:  # the swap shortcut must equal the library path the search uses
            ref_model = compressed_copy(model, space.decisions(plan), stats, settings,
                                        baseline=space.baseline)[0]
            q2 = evaluator.evaluate(ref_model)
            del ref_model
            check = {"swap_kl": q.kl, "compressed_copy_kl": q2.kl,
                     "abs_diff": abs(q.kl - q2.kl)}
            print(f"  check: compressed_copy gives KL {q2.kl:.6g} (swap {q.kl:.6g})", flush=True)

    sur = np.array([r["surrogate_kl"] for r in rows])
    meas = np.array([r["measured_kl"] for r in rows])
    summary = {"all": correlations(sur, meas),
               "surrogate<=0.1": correlations(sur[sur <= 0.1], meas[sur <= 0.1]),
               "measured<=0.1": correlations(sur[meas <= 0.1], meas[meas <= 0.1]),
               "surrogate>0.1": correlations(sur[sur > 0.1], meas[sur > 0.1])}
    total_s = time.perf_counter() - t_all

    lines = ["| subset | n | Spearman | Kendall τ | Pearson | Pearson (log10) | slope (LS, origin) "
             "| median ratio | min–max ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        if s["n"] < 3:
            lines.append(f"| {name} | {s['n']} | – | – | – | – | – | – | – |")
            continue
        lines.append(f"| {name} | {s['n']} | {s['spearman']:.3f} | {s['kendall_tau']:.3f} | "
                     f"{s['pearson']:.3f} | {s['pearson_log10']:.3f} | {s['slope_ls_origin']:.3f} "
                     f"| {s['ratio_median']:.3f} | {s['ratio_min']:.2f}–{s['ratio_max']:.2f} |")
    plan_lines = ["| plan | units | choices | surrogate KL | measured KL | ratio |",
                  "|---:|---:|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: r["surrogate_kl"]):
        mix = ", ".join(f"{k.replace('dense+', '')}×{v}" for k, v in sorted(r["choices"].items()))
        plan_lines.append(f"| {r['plan']} | {r['units_compressed']} | {mix} | "
                          f"{r['surrogate_kl']:.4g} | {r['measured_kl']:.4g} | "
                          f"{r['measured_kl'] / r['surrogate_kl']:.3f} |")
    print()
    print("\n".join(lines))
    print()
    print("\n".join(plan_lines))
    print(f"\nprofile {profile_s:.0f}s, total wall time {total_s:.0f}s")
    print(f"reproduce: {command}")
    result = {
        "benchmark": "surrogate_fidelity", "command": command, "machine": info,
        "model": {"id": loaded.model_id, "content_hash": loaded.content_hash},
        "space": {"target": space.target, "runtime": space.runtime,
                  "baseline": str(space.baseline), "units": len(units), "choices": CHOICES},
        "data": {"source": data.source, "content_hash": data.content_hash,
                 "seq_len": args.seq_len, "calib_blocks": args.calib_blocks,
                 "eval_blocks": args.eval_blocks, "eval_tokens": int(data.eval.numel()),
                 "seed": args.seed},
        "settings": {"prune_score": settings.prune_score, "quant_method": settings.quant_method},
        "plan_drawing": {"plans": args.plans, "min_fraction": args.min_fraction,
                         "dirichlet_alpha": DIRICHLET_ALPHA, "seed": args.seed},
        "ppl_ref": evaluator.ppl_ref, "profile_s": profile_s, "setup_s": setup_s,
        "total_s": total_s, "quick": args.quick, "swap_check": check, "summary": summary,
        "plans": rows, "profile_scores": profile.scores,
        "markdown": "\n".join(lines) + "\n\n" + "\n".join(plan_lines),
    }
    write_result(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
