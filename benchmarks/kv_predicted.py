"""KV-cache formats at vendors' operating points: predicted gain over the best weights-only
configuration, Llama-3.1-8B and -70B shapes on H100 and H200 (vLLM), by context length.

For each (model, target, lengths, mode) the cost model (autoplan/cost, nothing timed) is
evaluated for every dense weight format vLLM accelerates on the target, once with the
runtime's own 16-bit cache (weights-only) and once with every KV-cache format it serves;
each configuration at its own operating point (`--batch max`: the largest batch that fits;
SLO: the largest batch meeting the TPOT limit), as `autoplan estimate` resolves them. The
best weights-only and the best weights + KV configurations by end-to-end output tokens/s
are written side by side with the arithmetic: weights and KV bytes, the batch each allows,
the decode step and where its time goes. SLO mode: TPOT <= 30 ms (8B) / 40 ms (70B).

Usage:
  python benchmarks/kv_predicted.py [--out benchmarks/results/kv_predicted.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402

from autoplan.cost import CostModel, resolve_config  # noqa: E402
from autoplan.cost.operating import (NoOperatingPoint, OperatingRequest,  # noqa: E402
                                     resolve_operating_point)
from autoplan.formats import DENSE, Choice, Precision  # noqa: E402
from autoplan.formats.kv import KvFormat  # noqa: E402
from autoplan.runtimes import (accelerated_choices, default_kv,  # noqa: E402
                               served_kv_formats)
from autoplan.targets import get_target  # noqa: E402
from autoplan.workload import Workload  # noqa: E402

MODELS = ("llama-3.1-8b", "llama-3.1-70b")
TARGETS = ("h100-sxm", "h200")
LENGTHS = ((1024, 256), (4096, 512), (8192, 1024), (32768, 1024), (65536, 1024))
# The SLO mode's TPOT limit per model: about twice its batch-1 TPOT on H100 (predicted
# 8B int8 ~10 ms, 70B int4 ~32 ms), so the limit, not only memory, can bound the batch.
TPOT_SLO_MS = {"llama-3.1-8b": 30.0, "llama-3.1-70b": 40.0}
RUNTIME = "vllm"


def _evaluate(spec, target, choice: Choice, kv: KvFormat, req: OperatingRequest) -> dict | None:
    def build(w: Workload) -> CostModel:
        return CostModel(spec, target, w, kv=kv)

    try:
        point = resolve_operating_point(spec, target, choice, req, model_for=build)
    except NoOperatingPoint:
        return None
    est = build(point.workload).evaluate(choice)
    attention = est.fixed["attention"].decode_s
    weights_s = sum(row.decode_s for row in est.layers)
    return {
        "weights": choice.precision.value, "kv_cache": kv.value,
        "batch": point.workload.batch, "bound": point.bound,
        "throughput_tok_s": est.metrics.throughput,
        "decode_tok_s": est.metrics.decode_tokens_per_s,
        "tpot_ms": est.metrics.tpot_s * 1e3, "ttft_s": est.metrics.ttft_s,
        "weights_gb": est.memory.weights_bytes / 1e9,
        "kv_cache_gb": est.memory.kv_cache_bytes / 1e9,
        "capacity_gb": est.memory.capacity_bytes / 1e9,
        "kv_kib_per_token": est.kv.bytes_per_token / 1024,
        "kv_mb_per_sequence": est.kv.bytes_per_sequence / 1e6,
        "decode_step": {"linear_ms": weights_s * 1e3, "attention_ms": attention * 1e3,
                        "kv_read_gb": est.kv.read_bytes / 1e9,
                        "other_ms": (est.metrics.decode_s - weights_s - attention) * 1e3},
    }


def _best(rows: list[dict]) -> dict | None:
    rows = [r for r in rows if r is not None]
    return max(rows, key=lambda r: r["throughput_tok_s"]) if rows else None


def case(model: str, target_name: str, input_len: int, output_len: int, mode: str) -> dict:
    spec, target = resolve_config(model), get_target(target_name)
    req = (OperatingRequest("max", input_len, output_len) if mode == "max" else
           OperatingRequest(None, input_len, output_len, tpot_s=TPOT_SLO_MS[model] / 1e3))
    weights = accelerated_choices(target, RUNTIME, [
        Choice(DENSE, Precision(p)) for p in ("bf16", "fp8_e4m3", "fp8_b128", "int8", "int8_wo",
                                   "int4_g128", "uint4_g128")])
    base_kv = default_kv(target, RUNTIME)
    kvs = [k for k in served_kv_formats(target, RUNTIME) if k != KvFormat.FP16]
    weights_only = _best([_evaluate(spec, target, c, base_kv, req) for c in weights])
    with_kv = _best([_evaluate(spec, target, c, k, req) for c in weights for k in kvs])
    ratio = (with_kv["throughput_tok_s"] / weights_only["throughput_tok_s"]
             if weights_only and with_kv else None)
    return {"model": model, "target": target_name, "runtime": RUNTIME, "mode": mode,
            "tpot_slo_ms": TPOT_SLO_MS[model] if mode == "slo" else None,
            "input_len": input_len, "output_len": output_len,
            "weights_only": weights_only, "with_kv": with_kv, "gain": ratio,
            "goal_met": ratio is not None and ratio >= 1.3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/kv_predicted.json")
    args = parser.parse_args(argv)
    info, command = start_run(0, argv)
    rows = [case(m, t, i, o, mode) for m in MODELS for t in TARGETS for i, o in LENGTHS
            for mode in ("max", "slo")]
    for r in rows:
        w, k = r["weights_only"], r["with_kv"]
        if not w or not k:
            print(f"{r['model']:14s} {r['target']:8s} {r['input_len']:>6}/{r['output_len']:<5} "
                  f"{r['mode']:4s} nothing fits")
            continue
        print(f"{r['model']:14s} {r['target']:8s} {r['input_len']:>6}/{r['output_len']:<5} "
              f"{r['mode']:4s} weights-only {w['weights']:>10s} B={w['batch']:<5} "
              f"{w['throughput_tok_s']:>8,.0f} tok/s | +KV {k['weights']:>10s} "
              f"{k['kv_cache']:>13s} B={k['batch']:<5} {k['throughput_tok_s']:>8,.0f} tok/s "
              f"| {r['gain']:.2f}x")
    write_result(args.out, {
        "what": "best weights-only vs best weights + KV-cache configuration, end-to-end "
                "output tokens/s, PREDICTED by the cost model (nothing measured)",
        "machine": info, "command": command, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
