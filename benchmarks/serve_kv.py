"""llama.cpp serving a KV-bound workload: the plan's compressed cache (q8_0) vs the
engine's 16-bit cache, same GGUF, same cache memory, side by side in one run.

Both sides are the same GGUF served by autoplan's continuous-batching llama.cpp server
(autoplan/engines/llamacpp_batch_server.py: up to --n-seq sequences share one cache, a
request admitted when its prompt + output cells are free, chunked prefill, flash attention),
each with the same cache MEMORY (--cache-mb; default: what --base-seqs sequences of the
workload take in the 16-bit cache): the 16-bit side gets cache_mb / (bytes per token) cells,
the q8_0 side 16/8.5 as many. Long prompts and many concurrent requests make the cache, not
compute, bound how many requests run at once.

Driven by vLLM's own `vllm bench serve` (random prompts of --input-len tokens, exactly
--output-len output tokens, Poisson arrivals) at each rate, the sides interleaved per rate
(order alternating), with the 1-minute load average recorded per run. Per side: the highest
rate whose p99 TPOT holds the SLO while the server keeps up with its arrivals (achieved >=
0.8 x offered: a TPOT SLO alone ignores the queue, whose wait shows in TTFT); the goal is
`rate_ratio_at_slo` (plan / baseline) >= 1.3. The SLO, unless --slo-tpot-ms sets it, is 2x
the baseline's p99 TPOT at the lowest rate, measured first in the same run.

    python benchmarks/serve_kv.py [--gguf FILE] [--plan-cache q8_0] [--baseline-cache f16]
        [--rates 0.05,0.1,0.15,0.2,0.3] [--input-len 1024] [--output-len 256]
        [--out benchmarks/results/serve_kv_llamacpp.json]

Needs both engines: `autoplan engines install llama.cpp` and `autoplan engines install vllm`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import cpu_flags, start_run, write_result  # noqa: E402

KEPT_UP = 0.8  # achieved / offered request rate below which the queue grows through the run


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default="", help="the GGUF both sides serve (default: the "
                   "embedded model's, or --plan's export)")
    p.add_argument("--plan", default="", help="a plan JSON: its kv_cache.format is the plan "
                   "side's cache")
    p.add_argument("--plan-cache", default="q8_0")
    p.add_argument("--baseline-cache", default="f16")
    p.add_argument("--base-seqs", type=int, default=3,
                   help="sequences of the workload the 16-bit cache holds (sets --cache-mb)")
    p.add_argument("--cache-mb", type=float, default=0.0)
    p.add_argument("--n-seq", type=int, default=16, help="sequence slots (cells bind first)")
    p.add_argument("--rates", default="0.05,0.1,0.15,0.2,0.3")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--chunk", type=int, default=256, help="prefill tokens per step")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--slo-tpot-ms", type=float, default=0.0)
    p.add_argument("--out", default="benchmarks/results/serve_kv_llamacpp.json")
    p.add_argument("--logs", default="")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _bytes_per_token(spec, cache: str) -> float:  # noqa: ANN001
    from autoplan.cost.kv import KvLayout, bytes_per_token

    return bytes_per_token(spec, KvLayout.of(spec, cache))


def _sweep(sides: dict, gguf: Path, tokenizer: Path, args: argparse.Namespace,
           rates: list[float], logs: Path | None) -> dict:
    from autoplan.engines.llamacpp_serve import llamacpp_batch_server
    from autoplan.engines.serving import bench_serve

    out = {n: {**s, "points": [], "load_avg_1m": []} for n, s in sides.items()}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, side in sides.items():
            srv = llamacpp_batch_server(gguf, cache_type=side["cache_type"], n_ctx=side["cells"],
                                        n_seq=args.n_seq, alias=name, chunk=args.chunk,
                                        threads=args.threads or None,
                                        log_path=(logs / f"{name}.log") if logs else None)
            servers[name] = stack.enter_context(srv)
            print(f"{name}: {side['cache_type']} cache, {side['cells']} cells "
                  f"({side['concurrent']} sequences of the workload), ready in "
                  f"{srv.ready_seconds:.0f} s on {srv.base_url}")
        for i, rate in enumerate(rates):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            for name in order:
                load = os.getloadavg()[0]
                (p,) = bench_serve(servers[name].base_url, name, tokenizer, [rate],
                                   input_len=args.input_len, output_len=args.output_len,
                                   num_prompts=args.num_prompts, seed=args.seed, echo=print)
                out[name]["points"].append(p.to_dict())
                out[name]["load_avg_1m"].append(round(load, 2))
                print(f"  {name} rate {rate:g}: {p.request_throughput:.3f} req/s, TTFT p99 "
                      f"{p.ttft_p99_ms:.0f} ms, TPOT p50/p99 {p.tpot_p50_ms:.0f}/"
                      f"{p.tpot_p99_ms:.0f} ms (load {load:.1f})")
    return out


def _summary(sides: dict, slo: float) -> dict:
    from autoplan.engines.serving import RatePoint, max_rate_within_slo

    per = {}
    for name, side in sides.items():
        points = [RatePoint(**p) for p in side["points"]]
        kept = [p for p in points if p.request_throughput >= KEPT_UP * p.request_rate]
        best = max_rate_within_slo(kept, slo)
        raw = max_rate_within_slo(points, slo)
        per[name] = {"max_rate_at_slo": best.request_rate if best else 0.0,
                     "max_rate_tpot_only": raw.request_rate if raw else 0.0,
                     "saturated_req_s": max(p.request_throughput for p in points)}
    b, p = per["baseline"], per["plan"]

    def ratio(key: str) -> float | None:
        return p[key] / b[key] if b[key] else None

    r = ratio("max_rate_at_slo")
    return {"per_side": per, "rate_ratio_at_slo": r,
            "rate_ratio_tpot_only": ratio("max_rate_tpot_only"),
            "saturated_ratio": ratio("saturated_req_s"),
            "goal_1_3x_met": bool(r is not None and r >= 1.3)}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    from autoplan.engines import engine_python
    from autoplan.engines.serving import stop_on_signals
    from autoplan.errors import AutoplanError
    from autoplan.models.loader import ensure_hf_folder
    from autoplan.models.registry import resolve_model_arg
    from autoplan.modelspec import ModelSpec

    stop_on_signals()
    try:
        engine_python("llama.cpp")
        engine_python("vllm")
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    source = resolve_model_arg("smollm2-135m")
    tokenizer = ensure_hf_folder(source)
    plan_cache = args.plan_cache
    if args.plan:
        from autoplan.plan.io import load_plan

        plan = load_plan(args.plan)
        if plan.kv_cache is not None:
            plan_cache = plan.kv_cache.flag
    gguf = Path(args.gguf) if args.gguf else source.path
    spec = ModelSpec.from_path(tokenizer)
    ctx = args.input_len + args.output_len
    base_tok = _bytes_per_token(spec, args.baseline_cache)
    cache_bytes = args.cache_mb * 1e6 if args.cache_mb else args.base_seqs * ctx * base_tok
    sides = {}
    for name, cache in (("baseline", args.baseline_cache), ("plan", plan_cache)):
        per_tok = _bytes_per_token(spec, cache)
        cells = int(cache_bytes // per_tok)
        sides[name] = {"cache_type": cache, "cells": cells, "bytes_per_token": per_tok,
                       "concurrent": cells // ctx}
    rates = sorted(float(r) for r in args.rates.split(","))
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    try:
        done = _sweep(sides, gguf, tokenizer, args, rates, logs)
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    slo = args.slo_tpot_ms or 2 * done["baseline"]["points"][0]["tpot_p99_ms"]
    summary = _summary(done, slo)
    doc = {"what": "llama.cpp serving, compressed vs 16-bit KV cache, same cache memory "
                   "(MEASURED)",
           "machine": {**info, "cpu_flags": cpu_flags(),
                       "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]},
           "command": command, "engine": "llama.cpp via llama-cpp-python 0.3.36 (C API), "
                                         "autoplan/engines/llamacpp_batch_server.py",
           "gguf": gguf.name, "cache_bytes": cache_bytes, "n_seq": args.n_seq,
           "workload": {"input_len": args.input_len, "output_len": args.output_len,
                        "num_prompts": args.num_prompts, "rates": rates,
                        "arrivals": "Poisson", "dataset": "random, --ignore-eos",
                        "order": "both servers up; per rate each side in turn, the order "
                                 "alternating"},
           "slo_tpot_ms": slo,
           "slo_rule": "given" if args.slo_tpot_ms else
                       "2x the baseline's p99 TPOT at the lowest rate, measured first",
           "kept_up": f"achieved >= {KEPT_UP:g} x offered rate",
           "sides": done, "summary": summary,
           "rate_ratio_at_slo": summary["rate_ratio_at_slo"]}
    write_result(args.out, doc)
    s = summary
    print(f"p99 TPOT SLO {slo:.0f} ms: baseline {s['per_side']['baseline']['max_rate_at_slo']:g}"
          f" req/s, plan {s['per_side']['plan']['max_rate_at_slo']:g} req/s -> "
          f"rate_ratio_at_slo {s['rate_ratio_at_slo']}; wrote {args.out}")
    return 0 if not math.isnan(slo) else 1


if __name__ == "__main__":
    raise SystemExit(main())
