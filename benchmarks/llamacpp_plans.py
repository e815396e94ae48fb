"""llama.cpp on SmolLM2-135M: a searched per-tensor GGUF plan vs uniform GGUF types vs the
original Q4_1 file, decode tok/s and KL through llama.cpp's own logits, side by side.

Sides (each one GGUF file run by llama.cpp in the engine venv):
  plan         `autoplan search --target local --runtime llama.cpp` at --budget, exported
               with `autoplan export --format gguf` (or --plan PLAN.json)
  q8_0 q4_0 q5_0 q5_1   every linear layer (lm_head included) in one type, exported the same way
  q4_k q6_k    llama.cpp's own quantizer (llama_model_quantize, pure) from an F32 export:
               gguf-py cannot quantize K-quants, and SmolLM2's 576-wide rows are not a
               multiple of 256, so llama.cpp itself falls back (Q4_K -> Q5_0, Q6_K -> Q8_0)
               everywhere but ffn_down; the file's real type counts are reported
  original     the embedded model's own Q4_1 GGUF (Q8_0 token embedding = tied lm_head)

The plan is searched with `--objective tpot` by default: the ranking here is decode speed,
and on llama.cpp Q8_0/Q4_0/Q5_0 prefill through a fast GEMM (llamafile) that Q4_1/Q5_1 lack,
so a request-throughput objective trades decode speed for prefill on a 128/64 workload.

Measured, in one run: decode tok/s (batch 1, --input-len prompt from held-out text,
--output-len greedy tokens; requests interleaved round-robin over the sides so load changes
hit every side alike; median over requests of 1 / mean step), TTFT, and KL(P_original ||
P_side) with perplexity on the search's evaluation blocks, both distributions from
llama.cpp's logits. Next to them: the cost model's prediction (measured ggml kernels +
measured non-GEMM step, `predicted`) and autoplan's simulated KL to the fp32 model
(`simulated_kl`; the original itself scores ~0.0035 there: llama.cpp's activation
rounding, which its own KL reference already contains).

Reported, never asserted (a measurement, not a test): whether the plan beats uniform Q8_0
on decode tok/s (its slowest request faster than Q8_0's fastest) at equal or better KL, and
every uniform type whose KL meets the budget.

Usage:
  python benchmarks/llamacpp_plans.py [--budget 'kl<=0.01'] [--objective tpot] [--plan PLAN.json]
      [--threads 1] [--requests 6] [--input-len 128] [--output-len 64] [--trials 500]
      [--gguf-dir DIR] [--out benchmarks/results/llamacpp_plans.json]
  python benchmarks/llamacpp_plans.py --speed-only [--plan PLAN.json] [--sides q8_0] [--threads 1]
      (predicted vs measured decode tok/s only: benchmarks/results/llamacpp_speed_check.json)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402

UNIFORM = ("q8_0", "q4_0", "q5_0", "q5_1")
KQUANTS = {"q4_k": ("Q4_K", 12), "q6_k": ("Q6_K", 14)}  # side -> (ggml name, ggml type id)
FTYPES = {12: 15, 14: 18}  # ggml type -> LLAMA_FTYPE_MOSTLY_Q4_K_M, LLAMA_FTYPE_MOSTLY_Q6_K
RESULTS = Path(__file__).resolve().parent / "results"


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m",
                    help="a GGUF model (default: the embedded SmolLM2; benchmarks/moefy.py "
                         "--gguf writes its MoEfied version)")
    ap.add_argument("--budget", default="kl<=0.01")
    ap.add_argument("--objective", default="tpot",
                    help="search objective (tpot: decode speed, what this benchmark ranks)")
    ap.add_argument("--plan", default=None, help="use this plan instead of searching")
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads (default: physical cores)")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf-dir", default=None,
                    help="where the GGUF files go (default: <cache>/llamacpp_plans)")
    ap.add_argument("--no-simulated-kl", action="store_true")
    ap.add_argument("--sides", default=",".join(UNIFORM + tuple(KQUANTS)),
                    help="the uniform sides beside the plan and the original (q8_0 always; "
                         "fewer sides: a shorter run on a busy machine)")
    ap.add_argument("--speed-only", action="store_true",
                    help="only the cost model's predicted decode tok/s beside llama.cpp's "
                         "measured decode (no KL, no exactness): the kernel table's check")
    ap.add_argument("--exactness-only", action="store_true",
                    help="only compare ggml's mul_mat with autoplan's simulated layer per type")
    ap.add_argument("--out", default=str(RESULTS / "llamacpp_plans.json"))
    return ap.parse_args(argv)


def _search(args: argparse.Namespace, plan_path: Path):  # noqa: ANN202 - a Plan
    from autoplan.plan.io import load_plan
    from autoplan.search import ExecutionSettings, SearchRequest, run_search
    from autoplan.workload import Workload

    if args.plan:
        return load_plan(args.plan)
    req = SearchRequest(model=args.model, target="local", runtime="llama.cpp",
                        budget=args.budget, workload=Workload(batch=1, input_len=args.input_len,
                                                              output_len=args.output_len),
                        objective=args.objective, trials=args.trials, seed=args.seed,
                        out=plan_path, execution=ExecutionSettings(execution="memory", threads=args.threads))
    t0 = time.perf_counter()
    plan = run_search(req).plan
    print(f"searched in {time.perf_counter() - t0:.0f} s: {plan.search.outcome}, simulated KL "
          f"{plan.quality.kl:.4f}")
    return plan


def _uniform(plan, precision: str):  # noqa: ANN001, ANN202 - Plan in, Plan out
    decisions = {name: f"dense+{precision}" for name in plan.decisions}
    return plan.model_copy(update={"decisions": decisions, "audit": plan.audit.model_copy(
        update={"tensors": {}})})


def _kquant(f32: Path, out: Path, ggml_type: int, threads: int) -> Path:
    """llama.cpp's own quantizer (pure: one type, with llama.cpp's shape fallbacks, which
    also pick output.weight's type; token embedding kept Q8_0 like autoplan's exports)."""
    from autoplan.engines import engine_python

    code = (
        "import sys, llama_cpp.llama_cpp as c\n"
        "p = c.llama_model_quantize_default_params()\n"
        "p.nthread, p.pure = int(sys.argv[3]), True\n"
        "p.token_embedding_type = 8  # GGML_TYPE_Q8_0\n"
        f"p.ftype = {FTYPES[ggml_type]}  # llama_ftype whose default type is this one\n"
        "rc = c.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p)\n"
        "sys.exit(rc)\n")
    proc = subprocess.run([str(engine_python("llama.cpp")), "-c", code, str(f32), str(out),
                           str(threads)], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"llama_model_quantize failed: {proc.stderr.strip()[-300:]}")
    return out


def _type_counts(path: Path) -> dict[str, int]:
    from collections import Counter

    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors
                        if t.name.endswith(".weight") and len(t.shape) >= 2))  # MoE: 3-D


def _sides(args: argparse.Namespace, names: tuple[str, ...]) -> tuple[str, ...]:
    """The sides of `names` this run measures (q8_0 always: the goal's comparison)."""
    wanted = set(args.sides.split(",")) | {"q8_0"}
    return tuple(n for n in names if n in wanted)


def _stem(args: argparse.Namespace) -> str:
    """File-name stem of the exported GGUFs: the model's name."""
    return "smollm2" if args.model == "smollm2-135m" else Path(args.model).stem


def _files(plan, loaded, args, gguf_dir: Path) -> dict[str, Path]:  # noqa: ANN001
    from autoplan.export import export_plan

    stem = _stem(args)
    files = {"plan": export_plan(plan, loaded, "gguf", gguf_dir / f"{stem}-plan.gguf")}
    for precision in _sides(args, UNIFORM):
        files[precision] = export_plan(_uniform(plan, precision), loaded, "gguf",
                                       gguf_dir / f"{stem}-{precision}.gguf")
    kquants = _sides(args, tuple(KQUANTS))
    if not kquants:
        files["original"] = loaded.source.path
        return files
    f32 = export_plan(_uniform(plan, "fp32"), loaded, "gguf", gguf_dir / f"{stem}-f32.gguf")
    from autoplan.engines.llamacpp import default_threads

    for side in kquants:
        _name, type_id = KQUANTS[side]
        files[side] = _kquant(f32, gguf_dir / f"{stem}-{side}.gguf", type_id,
                              args.threads or default_threads())
    files["original"] = loaded.source.path
    return files


def _prompts(loaded, args) -> list:  # noqa: ANN001
    from autoplan.quality.text import load_text_dataset

    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=args.input_len,
                             n_calib=args.requests, n_eval=0, seed=args.seed + 1)
    return [block[None].numpy() for block in data.calib]


def _speed(files: dict[str, Path], prompts: list, args) -> dict:  # noqa: ANN001
    """Interleaved greedy generation: every round runs one prompt on every side."""
    from autoplan.engines.llamacpp import LlamaCppWorker

    workers = {name: LlamaCppWorker(path, threads=args.threads,
                                    n_ctx=args.input_len + args.output_len + 8)
               for name, path in files.items()}
    steps: dict[str, list[float]] = {n: [] for n in files}
    ttft: dict[str, list[float]] = {n: [] for n in files}
    request: dict[str, list[float]] = {n: [] for n in files}
    loads = []
    try:
        for w in workers.values():
            w.generate(prompts[0][:, :8], 4)  # warm-up
        for prompt in prompts:
            loads.append(os.getloadavg()[0])
            for name, w in workers.items():
                res = w.generate(prompt, args.output_len)
                steps[name].append(res.tpot_s)
                ttft[name].append(res.ttft_s)
                request[name].append(args.output_len / (res.ttft_s + sum(res.step_s)))
    finally:
        for w in workers.values():
            w.close()
    return {name: {"decode_tok_s": statistics.median(1 / s for s in steps[name]),
                   "tpot_ms_p50": statistics.median(steps[name]) * 1e3,
                   "ttft_ms_p50": statistics.median(ttft[name]) * 1e3,
                   "request_tok_s": statistics.median(request[name]),
                   "decode_tok_s_runs": [1 / s for s in steps[name]],
                   "peak_rss_mb": workers[name].peak_rss_bytes / 2**20}
            for name in files} | {"_load_avg_1m": loads}


def _decisions(plan, loaded, side: str) -> dict | None:  # noqa: ANN001
    from autoplan.engines.ggml_microbench import source_decisions
    from autoplan.formats import Choice

    if side == "plan":
        texts = plan.decisions
    elif side in UNIFORM:
        texts = {name: f"dense+{side}" for name in plan.decisions}
    elif side == "original":
        texts = source_decisions(loaded)
    else:
        return None
    return {name: Choice.parse(text) for name, text in texts.items()}


def _predicted(plan, loaded, args, sides) -> tuple[dict, dict]:  # noqa: ANN001
    """Cost-model decode tok/s per side from the measured ggml kernels (cached) and a fresh
    non-GEMM measurement; K-quant sides have no kernels in the table (None)."""
    from autoplan.engines.ggml_microbench import search_kernel_table
    from autoplan.cost import CostModel
    from autoplan.formats import Choice
    from autoplan.search import build_space
    from autoplan.backends.registry import resolve_target as get_target
    from autoplan.workload import Workload

    wl = Workload(batch=1, input_len=args.input_len, output_len=args.output_len)
    target = get_target("local")
    space = build_space(loaded.spec, target, "llama.cpp")
    table = search_kernel_table(loaded, space, wl, threads=args.threads)
    cost = CostModel(loaded.spec, target, wl, measured=table,
                     baseline=Choice.parse("dense+fp32"))
    out = {}
    for side in sides:
        decisions = _decisions(plan, loaded, side)
        out[side] = None if decisions is None else \
            cost.evaluate(decisions).metrics.decode_tokens_per_s
    meta = {k: table.get(k) for k in ("non_gemm_decode_s", "source_decode_step_s",
                                       "source_gemm_s", "source_decode_step_spread",
                                       "source_decode_clock", "clock",
                                       "source_load_avg_1m", "threads", "method", "device")}
    from autoplan.search.preparation import kernel_spread

    meta["kernel_spread"] = kernel_spread(table)
    return out, meta


def _simulated_kl(plan, loaded, sides) -> dict:  # noqa: ANN001
    """autoplan's simulated KL to the fp32 model on the search's evaluation blocks."""
    from autoplan.compress import CompressionSettings, compressed_copy
    from autoplan.quality.evaluator import QualityEvaluator

    tokens = _eval_tokens(plan, loaded)
    evaluator = QualityEvaluator(loaded.model, tokens)
    settings = CompressionSettings(plan.compression.prune_score, plan.compression.quant_method)
    out = {}
    for side in sides:
        decisions = _decisions(plan, loaded, side)
        if decisions is None:
            out[side] = None
            continue
        model, _ = compressed_copy(loaded.model, decisions, None, settings)
        out[side] = evaluator.evaluate(model).kl
    return out


def _eval_tokens(plan, loaded):  # noqa: ANN001, ANN202 - int64 [n, seq]
    from autoplan.quality.text import load_text_dataset

    cal = plan.audit.calibration
    return load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=cal.seq_len,
                             n_calib=cal.n_calib, n_eval=cal.n_eval, seed=cal.seed).eval


def exactness(loaded, layer: str | None = None, rows: int = 4) -> dict:  # noqa: ANN001
    """Per GGUF type: max |ggml - simulated| / max |y| for one real layer (block 3's MLP
    down projection, or its first expert's) and random inputs, next to the same gap when
    activations are left unrounded (weight-only simulation)."""
    import torch

    from autoplan.engines.ggml_microbench import GGML_TYPE_IDS
    from autoplan.engines.llamacpp import GgmlWorker
    from autoplan.formats import Choice
    from autoplan.models.graph import get_linear
    from autoplan.quant import SimulatedLinear

    layer = layer or next(la.name for la in loaded.spec.layers
                          if la.block == 3 and la.role in ("down", "expert_down"))
    linear = get_linear(loaded.model, layer)
    x = torch.randn(rows, linear.in_features, generator=torch.Generator().manual_seed(0)) * 2
    out = {}
    with GgmlWorker() as worker, torch.no_grad():
        for precision, ggml_type in GGML_TYPE_IDS.items():
            sim = SimulatedLinear.from_linear(linear, Choice.parse(precision.value))
            got = torch.from_numpy(worker.matmul(linear.weight.numpy(), x.numpy(), ggml_type))
            want, plain = sim(x).double(), x.double() @ sim.weight.double().t()
            scale = float(got.abs().max())
            out[precision.value] = {"simulated": float((got - want).abs().max()) / scale,
                                    "weight_only": float((got - plain).abs().max()) / scale}
    return {"layer": layer, "rows": rows, "relative_max_error": out}


def _faster(side: dict, other: dict) -> bool:
    """`side` decodes faster than `other` beyond the run's spread: its slowest request beats
    the other's fastest. A higher median alone is not a win: byte-identical files differ by
    the load each request met."""
    return min(side["decode_tok_s_runs"]) > max(other["decode_tok_s_runs"])


def _table(doc: dict) -> str:
    sides = doc["sides"]
    q8, orig = sides["q8_0"]["decode_tok_s"], sides["original"]["decode_tok_s"]
    lines = ["| side | linear tensor types | file MiB | decode tok/s (median; range) | vs q8_0 | "
             "vs original | predicted decode tok/s | TTFT ms | request tok/s | "
             "KL via llama.cpp | ppl | simulated KL | meets budget |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in sides.items():
        types = ", ".join(f"{k} {v}" for k, v in sorted(s["types"].items(), key=lambda x: -x[1]))
        pred = f"{s['predicted_tok_s']:.1f}" if s["predicted_tok_s"] else "-"
        sim = f"{s['simulated_kl']:.4f}" if s["simulated_kl"] is not None else "-"
        lines.append(f"| {name} | {types} | {s['file_mb']:.0f} | {s['decode_tok_s']:.1f} "
                     f"({min(s['decode_tok_s_runs']):.1f}-{max(s['decode_tok_s_runs']):.1f}) | "
                     f"{s['decode_tok_s'] / q8:.2f}x | {s['decode_tok_s'] / orig:.2f}x | {pred} | "
                     f"{s['ttft_ms_p50']:.0f} | {s['request_tok_s']:.1f} | "
                     f"{s['kl']:.4f} | {s['ppl']:.3f} | {sim} | "
                     f"{'yes' if s['meets_budget'] else 'no'} |")
    return "\n".join(lines)


def _speed_only(args, loaded, gguf_dir: Path, info, command, out: Path) -> int:  # noqa: ANN001
    """Predicted vs measured decode tok/s per side, and the load beside each round."""
    plan = _search(args, out.with_name(out.stem + "_plan.json"))
    files = _files(plan, loaded, args, gguf_dir)
    load_before = os.getloadavg()[0]
    predicted, kernel_meta = _predicted(plan, loaded, args, files)
    speed = _speed(files, _prompts(loaded, args), args)
    loads = speed.pop("_load_avg_1m")
    sides = {name: {"gguf": path.name, "types": _type_counts(path), **speed[name],
                    "quietest_request_tok_s": max(speed[name]["decode_tok_s_runs"]),
                    "predicted_tok_s": predicted.get(name)} for name, path in files.items()}
    write_result(out, {"machine": info, "command": command, "threads": args.threads,
                       "workload": {"batch": 1, "input_len": args.input_len,
                                    "output_len": args.output_len, "requests": args.requests},
                       "load_avg_1m_before_kernel_table": round(load_before, 2),
                       "load_avg_1m_per_round": loads, "kernel_table": kernel_meta,
                       "sides": sides})
    print("| side | predicted decode tok/s | measured decode tok/s (median of requests) | "
          "quietest request | TPOT ms |")
    print("|---|---|---|---|---|")
    for name, s in sides.items():
        pred = f"{s['predicted_tok_s']:.1f}" if s["predicted_tok_s"] else "-"
        print(f"| {name} | {pred} | {s['decode_tok_s']:.1f} | {s['quietest_request_tok_s']:.1f} "
              f"| {s['tpot_ms_p50']:.2f} |")
    print(f"kernel table: {kernel_meta}")
    print(f"load average (1 min) per round: {', '.join(f'{x:.1f}' for x in loads)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    from autoplan.engines.llamacpp_quality import llamacpp_quality, llamacpp_reference
    from autoplan.models import load_model
    from autoplan.cache_dir import cache_root
    from autoplan.search import QualityBudget

    out = Path(args.out)
    gguf_dir = Path(args.gguf_dir) if args.gguf_dir else cache_root() / "llamacpp_plans"
    budget = QualityBudget.parse(args.budget)
    loaded = load_model(args.model)
    if args.speed_only:
        return _speed_only(args, loaded, gguf_dir, info, command, out)
    exact = exactness(loaded)
    for name, e in exact["relative_max_error"].items():
        print(f"ggml vs simulated {name}: {e['simulated']:.1e} (weight-only: {e['weight_only']:.1e})")
    if args.exactness_only:
        write_result(out, {"machine": info, "command": command, "exactness": exact})
        return 0
    plan = _search(args, out.with_name(out.stem + "_plan.json"))
    files = _files(plan, loaded, args, gguf_dir)
    print("files:", {k: str(v) for k, v in files.items()})
    predicted, kernel_meta = _predicted(plan, loaded, args, files)
    tokens = _eval_tokens(plan, loaded)
    reference = llamacpp_reference(files["original"], tokens, threads=args.threads)
    quality = {name: llamacpp_quality(path, reference, threads=args.threads)
               for name, path in files.items()}
    simulated = {} if args.no_simulated_kl else _simulated_kl(plan, loaded, files)
    speed = _speed(files, _prompts(loaded, args), args)
    loads = speed.pop("_load_avg_1m")
    sides = {}
    for name, path in files.items():
        q = quality[name]
        sides[name] = {"gguf": str(path), "file_mb": path.stat().st_size / 2**20,
                       "types": _type_counts(path), **speed[name],
                       "predicted_tok_s": predicted.get(name), "kl": q["kl"], "ppl": q["ppl"],
                       "simulated_kl": simulated.get(name),
                       "meets_budget": budget.metric != "kl" or q["kl"] <= budget.limit}
    plan_side, q8 = sides["plan"], sides["q8_0"]
    meeting = [n for n in UNIFORM + tuple(KQUANTS) if n in sides and sides[n]["meets_budget"]]
    goals = {
        "plan_beats_q8_0_tok_s_at_equal_or_better_kl":
            _faster(plan_side, q8) and plan_side["kl"] <= q8["kl"],
        "uniform_types_meeting_budget": meeting,
        "plan_beats_every_uniform_meeting_budget": all(
            _faster(plan_side, sides[n]) for n in meeting),
    }
    doc = {"machine": info, "command": command, "threads": args.threads, "budget": args.budget,
           "workload": {"batch": 1, "input_len": args.input_len, "output_len": args.output_len,
                        "requests": args.requests},
           "load_avg_1m_per_round": loads, "plan": {"decisions": plan.decisions,
                                                    "simulated_kl": plan.quality.kl,
                                                    "outcome": plan.search.outcome},
           "exactness": exact, "kernel_table": kernel_meta, "reference": {"gguf": str(files["original"]),
                                                      "ppl": reference.ppl},
           "sides": sides, "goals": goals}
    write_result(out, doc)
    print(_table(doc))
    print(f"goals: {goals}")
    print(f"load average (1 min) per round: {', '.join(f'{x:.1f}' for x in loads)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
