"""llama.cpp on the MoEfied SmolLM2's GGUF (benchmarks/moefy.py --gguf): its logits beside
autoplan's simulation of the same file, on held-out text.

The GGUF keeps the embedded model's Q4_1 attention and stores the experts in F32 (stacked
`ffn_*_exps` beside the router `ffn_gate_inp`). autoplan's side is the loaded model with every
layer simulated in the type the file stores (`source_decisions`: Q4_1 with the int8
activation rounding ggml's kernels do, F32 experts). Reported per block: KL(simulated ||
llama.cpp), each side's KL to the unrounded fp32 model, and how often their argmax agrees.

    python benchmarks/moe_llamacpp_logits.py [--model GGUF] [--blocks 4] [--seq-len 256]
        -> benchmarks/results/moe_llamacpp_logits.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402


def _kl(p, q) -> float:  # noqa: ANN001 - logits [n, vocab]; KL(p || q) in nats per token
    lp, lq = p.double().log_softmax(-1), q.double().log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="the MoE GGUF (default: $AUTOPLAN_CACHE/models/smollm2-135m-moe-e8k4.gguf)")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="benchmarks/results/moe_llamacpp_logits.json")
    args = ap.parse_args(argv)
    info, command = start_run(0, argv)

    import torch

    from autoplan.compress import CompressionSettings, compressed_copy
    from autoplan.engines.ggml_microbench import source_decisions
    from autoplan.engines.llamacpp import LlamaCppWorker
    from autoplan.formats import Choice
    from autoplan.models import load_model
    from autoplan.models._cache import models_dir
    from autoplan.quality.text import load_text_dataset

    path = Path(args.model) if args.model else models_dir() / "smollm2-135m-moe-e8k4.gguf"
    loaded = load_model(str(path))
    decisions = source_decisions(loaded)
    sim, _ = compressed_copy(loaded.model, {n: Choice.parse(c) for n, c in decisions.items()},
                             None, CompressionSettings("magnitude", "rtn"))
    blocks = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=args.seq_len,
                               n_calib=1, n_eval=args.blocks, seed=0).eval
    rows = []
    with LlamaCppWorker(path, n_ctx=args.seq_len, logits_all=True,
                        threads=args.threads) as worker:
        for block in blocks:
            with torch.no_grad():
                ref = loaded.model(input_ids=block[None]).logits[0]
                simulated = sim(input_ids=block[None]).logits[0]
            engine = torch.from_numpy(worker.logits(block.numpy())).float()
            rows.append({"kl_simulated_to_llamacpp": _kl(simulated, engine),
                         "kl_fp32_to_simulated": _kl(ref, simulated),
                         "kl_fp32_to_llamacpp": _kl(ref, engine),
                         "argmax_agreement": float((engine.argmax(-1) == simulated.argmax(-1))
                                                   .float().mean()),
                         "max_abs_logit_diff": float((engine - simulated).abs().max())})
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    spec = loaded.spec
    doc = {"machine": info, "command": command, "model": str(path),
           "experts": spec.moe.n_experts, "top_k": spec.moe.top_k,
           "types": sorted(set(decisions.values())), "blocks": len(rows),
           "seq_len": args.seq_len, "median": summary, "per_block": rows}
    write_result(args.out, doc)
    print(" ".join(f"{k} {v:.4g}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
