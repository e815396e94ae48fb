"""Streamed execution equals the in-memory one on the whole embedded model (issue 10 item 3).

    python benchmarks/stream_equivalence.py [--target h100-sxm] [--seq-len 256] [--calib 4]

On SmolLM2-135M: the full sensitivity profile (every profiled layer x every choice of the
target, as `autoplan profile --target T` computes it) in memory and streamed, each with its
own cold cache; then KL and perplexity of three whole-model candidates (every layer one
format; a mix; a 2:4 + int4 mix with GPTQ/SparseGPT) measured both ways. Reports the largest
relative difference of any score and of each KL, and the wall and peak RSS of each path (the
machine is shared: wall times are context, not the point). The CI test
(tests/integration/test_streaming_embedded.py) checks a sample of layers; this is the whole
model. Results: benchmarks/results/stream_equivalence.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import start_run, write_result  # noqa: E402


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h100-sxm")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--calib", type=int, default=4, help="calibration blocks")
    ap.add_argument("--eval", type=int, default=4, help="evaluation blocks")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "stream_equivalence.json")
    args = ap.parse_args()
    info, command = start_run(0, None)

    import torch

    from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
    from autoplan.formats import Choice
    from autoplan.models import load_model
    from autoplan.quality import QualityEvaluator, load_text_dataset
    from autoplan.search import profile_scope
    from autoplan.sensitivity import build_profile
    from autoplan.streaming.evaluate import StreamedEvaluator
    from autoplan.streaming.profile import build_profile_streamed
    from autoplan.streaming.skeleton import StreamedModel
    from autoplan.targets import get_target

    loaded = load_model("smollm2-135m")
    sm = StreamedModel(loaded.path, device=torch.device("cpu"))
    layers, choices, _base = profile_scope(loaded.spec, get_target(args.target), None)
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=args.seq_len,
                             n_calib=args.calib, n_eval=args.eval, seed=0)
    calib = list(data.calib.split(2))
    settings = CompressionSettings()
    kw = dict(model_hash=loaded.content_hash, calib_hash=data.content_hash, settings=settings,
              seed=0)
    work = Path(tempfile.mkdtemp(prefix="stream-eq-"))
    load0 = os.getloadavg()
    t = time.perf_counter()
    mem = build_profile(loaded.model, layers, choices, calib, cache_dir=work / "m", **kw)
    mem_s = time.perf_counter() - t
    t = time.perf_counter()
    st = build_profile_streamed(sm, layers, choices, calib, cache_dir=work / "s", **kw)
    st_s = time.perf_counter() - t
    worst, where = 0.0, None
    n_scores = 0
    for layer in layers:
        for key, ref in mem.scores[layer].items():
            got = st.scores[layer][key]
            rel = abs(got - ref) / max(abs(ref), 1e-12)
            n_scores += 1
            if rel > worst:
                worst, where = rel, f"{layer} {key}"
    print(f"profile: {n_scores} scores, worst relative difference {worst:.2e} ({where}); "
          f"memory {mem_s:.0f} s, stream {st_s:.0f} s", flush=True)

    c = [Choice.parse(x) for x in ("dense+fp8_e4m3", "2:4+bf16", "dense+int4_g64",
                                   "dense+int8")]
    cases = {
        "uniform fp8": ({n: c[0] for n in layers}, settings),
        "mixed fp8/2:4/int4/int8 (wanda, rtn)": (
            {n: c[i % 4] for i, n in enumerate(layers)}, settings),
        "mixed 2:4/int4 (sparsegpt, gptq)": (
            {n: c[1 + i % 2] for i, n in enumerate(layers)},
            CompressionSettings("sparsegpt", "gptq")),
    }
    ref = QualityEvaluator(loaded.model, data.eval)
    sev = StreamedEvaluator(sm, data.eval, calib_batches=calib)
    quality = {}
    for label, (decisions, s) in cases.items():
        stats = collect_stats(loaded.model, layers, calib, full=s.needs_hessian)
        compressed, _ = compressed_copy(loaded.model, decisions, stats, s)
        want = ref.evaluate(compressed)
        del compressed
        got, _ = sev.evaluate_decisions(decisions, s, needs_stats=True)
        quality[label] = {"kl_memory": want.kl, "kl_stream": got.kl,
                          "kl_rel_diff": abs(got.kl - want.kl) / want.kl,
                          "ppl_memory": want.ppl, "ppl_stream": got.ppl,
                          "ppl_rel_diff": abs(got.ppl - want.ppl) / want.ppl}
        print(f"{label}: KL {want.kl:.5f} vs {got.kl:.5f}", flush=True)
    result = {
        "command": command, "machine": info, "model": "smollm2-135m", "target": args.target,
        "calibration_tokens": int(data.calib.numel()), "evaluation_tokens":
        int(data.eval.numel()), "layers": len(layers), "choices": [str(x) for x in choices],
        "scores_compared": n_scores, "worst_score_rel_diff": worst, "worst_at": where,
        "profile_wall_s": {"memory": round(mem_s, 1), "stream": round(st_s, 1)},
        "quality": quality, "ppl_ref_memory": ref.ppl_ref, "ppl_ref_stream": sev.ppl_ref,
        "peak_rss_gib_process": round(_rss_gib(), 2),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "note": "measured; both paths in one process (peak RSS is the process's, both paths)",
    }
    write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
