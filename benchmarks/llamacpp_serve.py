"""llama.cpp serving a searched per-tensor GGUF plan under load, next to uniform Q8_0 and the
original Q4_1 file, in one run; plus a uniform-type sweep (KL and decode tok/s).

Sides (each one GGUF file):
  plan_throughput, plan_tpot
             `autoplan search --target local --runtime llama.cpp --objective O` at --budget,
             one per --objectives entry (or side `plan`: --plan PLAN.json), exported with
             `autoplan export --format gguf`. A one-request-at-a-time server's capacity
             follows request time (prefill + decode: objective throughput at batch 1);
             decode tok/s alone follows tpot. On llama.cpp they differ: Q8_0/Q4_0/Q5_0
             prefill through llamafile's GEMM, Q4_1/Q5_1 do not.
  q8_0 q5_1 q5_0 q4_1 q4_0   every linear layer (lm_head included) in one type, exported the
             same way (the uniform sweep)
  original   the embedded model's own Q4_1 GGUF (its Q8_0 token embedding is the tied lm_head)

Measured, in one run:
  * quality: KL(P_original || P_side) and perplexity on the plan's evaluation blocks, both
    distributions from llama.cpp's own logits (autoplan.engines.llamacpp_quality);
  * decode tok/s of every side (batch 1, --input-len prompt, --output-len greedy tokens,
    --decode-requests prompts interleaved round-robin over the sides; median of 1 / mean step);
  * serving (--serve sides, default every plan, q8_0, original): each file behind llama.cpp's
    OpenAI-compatible server (llama-cpp-python's llama_cpp.server, via
    autoplan.engines.llamacpp_serve; 127.0.0.1; all servers up at once, idle when not driven),
    driven by vLLM's own `vllm bench serve` (random prompts of --input-len tokens, exactly
    --output-len output tokens: `--ignore-eos`, honoured by the launcher) at every --rates
    request rate (Poisson; `inf` sends all at once), the sides interleaved per rate; it records
    throughput, TTFT and TPOT p50/p99 and the highest rate that holds the SLOs.

llama-cpp-python's server runs one request at a time (a lock around the model): a queued
request waits before its first token, so load shows up in TTFT, and TPOT stays the decode
step at every rate. So the highest rate holding a p99 TPOT SLO alone says only whether a side's
step meets it; the capacity figures are the highest rate holding p99 TPOT **and** p99 TTFT
SLOs, and the saturated request throughput (rate `inf`).

Reported, never asserted, per plan: its rate at the SLOs and saturated throughput over
Q8_0's and the original's (goal: >= 1.3x the baseline); whether it beats uniform Q8_0 on
decode tok/s at equal or better KL; every uniform type meeting the budget, and whether the
plan beats each on decode tok/s.

Usage:
  python benchmarks/llamacpp_serve.py [--budget 'kl<=0.005'] [--objectives throughput,tpot |
      --plan PLAN.json] [--threads 1]
      [--rates 0.1,0.2,0.3,inf] [--num-prompts 8] [--input-len 128] [--output-len 64]
      [--slo-tpot-ms 50] [--slo-ttft-ms 4000] [--decode-requests 4] [--port 0]
      [--out benchmarks/results/serve_llamacpp.json]
Needs both engines: `autoplan engines install llama.cpp` and `autoplan engines install vllm`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result

SWEEP = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
RESULTS = Path(__file__).resolve().parent / "results"


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates takes numbers or inf, e.g. 0.1,0.2,inf: "
                                         f"{text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError("--rates must be positive request rates (or inf)")
    return rates


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="kl<=0.005")
    ap.add_argument("--objectives", default="throughput,tpot",
                    help="one plan searched per objective (sides plan_OBJECTIVE); throughput "
                         "(= request time at batch 1) is what a one-request-at-a-time server's "
                         "capacity follows, tpot is decode speed alone")
    ap.add_argument("--plan", default=None, help="serve this plan (side plan) instead of "
                                                 "searching")
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads (default: physical cores)")
    ap.add_argument("--rates", type=_rates, default=_rates("0.1,0.2,0.3,inf"))
    ap.add_argument("--num-prompts", type=int, default=8, help="requests per rate")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--slo-tpot-ms", type=float, default=50.0)
    ap.add_argument("--slo-ttft-ms", type=float, default=4000.0)
    ap.add_argument("--decode-requests", type=int, default=4,
                    help="prompts per side for the decode tok/s sweep")
    ap.add_argument("--serve", default=None,
                    help="sides served under load (default: every plan, q8_0, original)")
    ap.add_argument("--port", type=int, default=0,
                    help="first server port on 127.0.0.1 (sides take consecutive ones; "
                         "0: free ports)")
    ap.add_argument("--gguf-dir", default=None,
                    help="where the GGUF files go (default: <cache>/llamacpp_serve)")
    ap.add_argument("--out", default=str(RESULTS / "serve_llamacpp.json"))
    args = ap.parse_args(argv)
    args.objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    plans = ["plan"] if args.plan else [f"plan_{o}" for o in args.objectives]
    args.serve = [s.strip() for s in args.serve.split(",") if s.strip()] if args.serve else \
        [*plans, "q8_0", "original"]
    bad = [s for s in args.serve if s not in (*plans, "original", *SWEEP)]
    if bad or not plans or args.num_prompts < 1 or args.decode_requests < 1:
        ap.error(f"--serve takes {', '.join(plans)}, original, {', '.join(SWEEP)}; "
                 "--objectives at least one; --num-prompts and --decode-requests >= 1")
    args.plan_sides = plans
    args.requests = args.decode_requests  # the name llamacpp_plans' helpers read
    return args


def preflight(args: argparse.Namespace) -> list[int]:
    """Everything that can fail in a second, checked before minutes of work: both engines
    installed, the plan file readable, the given ports free. Returns the server ports."""
    from autoplan.engines import engine_python
    from autoplan.engines.serving import free_port, port_in_use
    from autoplan.errors import UserInputError

    engine_python("llama.cpp")
    engine_python("vllm")  # `vllm bench serve` drives the load
    if args.plan and not Path(args.plan).is_file():
        raise UserInputError(f"no plan file at '{args.plan}': pass a plan `autoplan search` "
                             "wrote, or drop --plan to search")
    if not args.port:
        return [free_port() for _ in args.serve]
    ports = [args.port + i for i in range(len(args.serve))]
    busy = [p for p in ports if port_in_use(p)]
    if busy:
        raise UserInputError(f"port {busy[0]} on 127.0.0.1 is in use: stop what listens there "
                             "or pick another --port")
    return ports


def _plans(args: argparse.Namespace, out: Path) -> dict:
    """side -> Plan: --plan, or one search per objective (plan file beside --out)."""
    from llamacpp_plans import _search

    if args.plan:
        return {"plan": _search(args, Path(args.plan))}
    plans = {}
    for objective, side in zip(args.objectives, args.plan_sides):
        search_args = argparse.Namespace(**{**vars(args), "objective": objective})
        plans[side] = _search(search_args, out.with_name(f"{out.stem}_{side}.json"))
    return plans


def _files(plans: dict, loaded, gguf_dir: Path) -> dict[str, Path]:
    from llamacpp_plans import _uniform

    from autoplan.export import export_plan

    files = {side: export_plan(plan, loaded, "gguf", gguf_dir / f"smollm2-{side}.gguf")
             for side, plan in plans.items()}
    first = next(iter(plans.values()))
    for precision in SWEEP:
        files[precision] = export_plan(_uniform(first, precision), loaded, "gguf",
                                       gguf_dir / f"smollm2-{precision}.gguf")
    files["original"] = loaded.source.path
    return files


def serve_sweep(files: dict[str, Path], ports: list[int], args, tokenizer: Path,
                echo=print) -> dict:
    """Every served side behind its own llama.cpp server; per rate, `vllm bench serve` drives
    each side in turn. Returns side -> {"points": [...], "load_avg_1m": [...]}."""
    from autoplan.engines.llamacpp_serve import llamacpp_server
    from autoplan.engines.serving import bench_serve

    n_ctx = args.input_len + args.output_len + 64  # random prompts re-tokenize a few longer
    out = {side: {"points": [], "load_avg_1m": []} for side in args.serve}
    with contextlib.ExitStack() as stack:
        servers = {}
        for side, port in zip(args.serve, ports):
            server = llamacpp_server(files[side], port=port, threads=args.threads, n_ctx=n_ctx,
                                     alias=side, ignore_eos=True)
            servers[side] = stack.enter_context(server)
            echo(f"{side}: llama.cpp server on {server.base_url} "
                 f"(ready in {server.ready_seconds:.1f} s)")
        for rate in args.rates:
            for side, server in servers.items():
                load = os.getloadavg()[0]
                (point,) = bench_serve(server.base_url, side, tokenizer, [rate],
                                       input_len=args.input_len, output_len=args.output_len,
                                       num_prompts=args.num_prompts, seed=args.seed, echo=echo)
                out[side]["points"].append(point.to_dict())
                out[side]["load_avg_1m"].append(round(load, 2))
                echo(f"  {side} @ {rate} req/s: {point.request_throughput:.3f} req/s, TTFT p99 "
                     f"{point.ttft_p99_ms:.0f} ms, TPOT p50/p99 {point.tpot_p50_ms:.1f}/"
                     f"{point.tpot_p99_ms:.1f} ms")
    return out


def slo_summary(points: list[dict], slo_tpot_ms: float, slo_ttft_ms: float) -> dict:
    """Highest rate within the p99 TPOT SLO; within p99 TPOT and TTFT SLOs; saturated
    throughput (the highest measured request throughput)."""
    def best(ok) -> float | None:
        rates = [p["request_rate"] for p in points if ok(p) and p["completed"] > 0]
        return max(rates) if rates else None

    return {
        "max_rate_tpot_slo": best(lambda p: p["tpot_p99_ms"] <= slo_tpot_ms),
        "max_rate_tpot_ttft_slo": best(lambda p: p["tpot_p99_ms"] <= slo_tpot_ms
                                       and p["ttft_p99_ms"] <= slo_ttft_ms),
        "saturated_req_s": max((p["request_throughput"] for p in points), default=None),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isinf(a) or math.isinf(b):
        return None
    return a / b


def goals(sides: dict, serving: dict, plan_sides: list[str], budget: str) -> dict:
    """Per plan side: the decode goals against the uniform sweep, and its serving figures
    over q8_0's and the original's (ratios; None where a side has no figure)."""
    q8 = sides["q8_0"]
    meeting = [n for n in SWEEP if sides[n]["meets_budget"]]
    out: dict = {"budget": budget, "uniform_types_meeting_budget": meeting}
    for name in plan_sides:
        plan = sides[name]
        g = {"beats_q8_0_tok_s_at_equal_or_better_kl":
             plan["decode_tok_s"] > q8["decode_tok_s"] and plan["kl"] <= q8["kl"],
             "beats_every_uniform_meeting_budget": all(
                 plan["decode_tok_s"] > sides[n]["decode_tok_s"] for n in meeting)}
        if name in serving:
            p = serving[name]["slo"]
            for base in ("q8_0", "original"):
                if base not in serving:
                    continue
                b = serving[base]["slo"]
                g[f"serving_vs_{base}"] = {k: _ratio(p[k], b[k]) for k in p}
                g[f"serving_vs_{base}"]["holds_1.3x_rate_at_slo"] = (
                    p["max_rate_tpot_ttft_slo"] is not None and
                    (b["max_rate_tpot_ttft_slo"] is None or
                     p["max_rate_tpot_ttft_slo"] >= 1.3 * b["max_rate_tpot_ttft_slo"]))
        out[name] = g
    return out


def _types(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda x: -x[1]))


def tables(doc: dict) -> str:
    sides, q8 = doc["sides"], doc["sides"]["q8_0"]["decode_tok_s"]
    lines = [("| side | linear tensor types | file MB | KL via llama.cpp | ppl | meets budget | "
              "decode tok/s (median) | vs q8_0 |"), "|---|---|---:|---:|---:|---|---:|---:|"]
    for name, s in sides.items():
        lines.append(f"| {name} | {_types(s['types'])} | {s['file_mb']:.0f} | {s['kl']:.4f} | "
                     f"{s['ppl']:.3f} | {'yes' if s['meets_budget'] else 'no'} | "
                     f"{s['decode_tok_s']:.1f} | {s['decode_tok_s'] / q8:.2f}x |")
    lines += ["", ("| side | rate req/s | done | req/s | out tok/s | TTFT p50 / p99 ms | "
                   "TPOT p50 / p99 ms | load |"), "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for side, s in doc["serving"].items():
        for p, load in zip(s["points"], s["load_avg_1m"]):
            lines.append(f"| {side} | {p['request_rate']:g} | {p['completed']} | "
                         f"{p['request_throughput']:.3f} | {p['output_throughput']:.1f} | "
                         f"{p['ttft_p50_ms']:.0f} / {p['ttft_p99_ms']:.0f} | "
                         f"{p['tpot_p50_ms']:.1f} / {p['tpot_p99_ms']:.1f} | {load:.1f} |")
    lines += ["", ("| side | max rate, p99 TPOT SLO | max rate, p99 TPOT + TTFT SLO | "
                   "saturated req/s |"), "|---|---:|---:|---:|"]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3g}"

    for side, s in doc["serving"].items():
        slo = s["slo"]
        lines.append(f"| {side} | {fmt(slo['max_rate_tpot_slo'])} | "
                     f"{fmt(slo['max_rate_tpot_ttft_slo'])} | {fmt(slo['saturated_req_s'])} |")
    return "\n".join(lines)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    info, command = start_run(args.seed, argv)
    ports = preflight(args)
    from llamacpp_plans import _eval_tokens, _prompts, _speed, _type_counts

    from autoplan.engines.llamacpp_quality import llamacpp_quality, llamacpp_reference
    from autoplan.engines.serving import stop_on_signals
    from autoplan.models import load_model
    from autoplan.cache_dir import cache_root
    from autoplan.search import QualityBudget

    stop_on_signals()  # SIGTERM / SIGHUP stop the servers like Ctrl-C does
    budget = QualityBudget.parse(args.budget)
    out = Path(args.out)
    gguf_dir = Path(args.gguf_dir) if args.gguf_dir else cache_root() / "llamacpp_serve"
    loaded = load_model("smollm2-135m")
    plans = _plans(args, out)
    files = _files(plans, loaded, gguf_dir)
    first = next(iter(plans.values()))
    reference = llamacpp_reference(files["original"], _eval_tokens(first, loaded),
                                   threads=args.threads)
    quality = {name: llamacpp_quality(path, reference, threads=args.threads)
               for name, path in files.items()}
    for name, q in quality.items():
        print(f"{name}: KL via llama.cpp {q['kl']:.4f}, ppl {q['ppl']:.3f}")
    speed = _speed(files, _prompts(loaded, args), args)
    decode_loads = speed.pop("_load_avg_1m")
    serving = serve_sweep(files, ports, args, loaded.path)
    for s in serving.values():
        s["slo"] = slo_summary(s["points"], args.slo_tpot_ms, args.slo_ttft_ms)
    sides = {name: {"gguf": path.name, "file_mb": path.stat().st_size / 2**20,
                    "types": _type_counts(path), "kl": quality[name]["kl"],
                    "ppl": quality[name]["ppl"], "meets_budget": budget.metric != "kl" or
                    quality[name]["kl"] <= budget.limit,
                    **{k: v for k, v in speed[name].items() if k != "peak_rss_mb"}}
             for name, path in files.items()}
    doc = {"machine": info, "command": command, "threads": args.threads,
           "budget": args.budget,
           "workload": {"input_len": args.input_len, "output_len": args.output_len,
                        "num_prompts_per_rate": args.num_prompts, "rates": args.rates,
                        "decode_requests": args.decode_requests},
           "slo": {"p99_tpot_ms": args.slo_tpot_ms, "p99_ttft_ms": args.slo_ttft_ms},
           "server": "llama-cpp-python llama_cpp.server (one request at a time), "
                     "use_extra_bufts=False, ignore_eos; load: vllm bench serve",
           "plans": {side: {"objective": plan.objective, "decisions": plan.decisions,
                            "simulated_kl": plan.quality.kl, "outcome": plan.search.outcome,
                            "search_wall_s": plan.search.wall_time_s}
                     for side, plan in plans.items()},
           "reference_ppl": reference.ppl, "decode_load_avg_1m": decode_loads,
           "sides": sides, "serving": serving,
           "goals": goals(sides, serving, list(plans), args.budget)}
    write_result(out, doc)  # machine paths made portable, as every benchmark does
    print(tables(doc))
    print(f"goals: {doc['goals']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from autoplan.errors import AutoplanError, UserInputError

    args = _args(argv)
    try:
        return run(args, argv)
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: every server this run started is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
