"""llama.cpp on autoplan's GGUF export of a gpt-oss plan: its logits beside autoplan's.

The tiny gpt-oss of tests/unit/test_gguf_gptoss_export.py (hidden 64, 4 experts of width 32,
top-2, 2 blocks; its GGUF written as llama.cpp's convert_hf_to_gguf.py writes gpt-oss, MXFP4
experts) with two plans exported to GGUF: every linear layer in a GGUF block type (experts
Q8_0 / Q4_0 / Q5_1 / Q8_0 by block and projection), and the experts in gguf_mxfp4 (ggml's
MXFP4, which keeps the source's MXFP4 experts byte for byte). Each is run by llama.cpp (one
thread, fp32 KV cache) on 48 tokens and compared with autoplan's side: the plan simulated
(for gguf_mxfp4: MXFP4 weights, Q8_0 inputs, as ggml-cpu runs them), and for the MXFP4
experts also the experts at their MXFP4 values with unrounded inputs and autoplan's
dense+mxfp4 simulation (MXFP4 inputs, as vLLM runs it).

    python benchmarks/gptoss_gguf_logits.py -> benchmarks/results/gptoss_gguf_logits.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import start_run, write_result  # noqa: E402


def _row(label: str, engine, simulated, ref) -> dict:  # noqa: ANN001 - [tokens, vocab] logits
    from tests.unit.test_gguf_gptoss_export import kl

    return {"side": label, "kl_simulated_to_llamacpp": kl(simulated, engine),
            "kl_fp32_to_simulated": kl(ref, simulated), "kl_fp32_to_llamacpp": kl(ref, engine),
            "argmax_agreement": float((engine.argmax(-1) == simulated.argmax(-1))
                                      .float().mean()),
            "position0_max_abs_diff_rel": float((engine[0] - simulated[0]).abs().max()
                                                / simulated.abs().max())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gptoss_gguf_logits.json")
    args = ap.parse_args(argv)
    info, command = start_run(0, argv)

    from autoplan.engines import engine_status
    from autoplan.export import export_plan
    from tests.unit.test_export_common import make_plan
    from tests.unit.test_gguf_gptoss_export import (TOKENS, engine_logits, gptoss_source,
                                                    mxfp4_export, plan_decisions,
                                                    simulated_logits)

    rows = []
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        (root / "types").mkdir()
        loaded, _ = gptoss_source(root / "types")
        decisions = plan_decisions(loaded)
        out = export_plan(make_plan(loaded, decisions, target="local", runtime="llama.cpp"),
                          loaded, "gguf", root / "types" / "plan.gguf")
        ref = simulated_logits(loaded, None)
        rows.append(_row("GGUF block types, plan simulated", engine_logits(out),
                         simulated_logits(loaded, decisions), ref))
        (root / "mxfp4").mkdir()
        loaded, _, _, out, _ = mxfp4_export(root / "mxfp4")
        engine = engine_logits(out)
        rows.append(_row("MXFP4 experts kept, gguf_mxfp4 plan simulated (Q8_0 inputs)", engine,
                         simulated_logits(loaded, plan_decisions(loaded, "dense+gguf_mxfp4")),
                         ref))
        exact = {n: "dense+fp32" if ".experts." in n else c
                 for n, c in plan_decisions(loaded).items()}
        rows.append(_row("MXFP4 experts kept, experts' inputs unrounded", engine,
                         simulated_logits(loaded, exact), ref))
        rows.append(_row("MXFP4 experts kept, autoplan's dense+mxfp4 (MXFP4 inputs)", engine,
                         simulated_logits(loaded, plan_decisions(loaded, "dense+mxfp4")), ref))
    write_result(args.out, {"machine": info, "command": command,
                            "engine": engine_status("llama.cpp").detail, "tokens": len(TOKENS),
                            "rows": rows})
    for r in rows:
        print(f"{r['side']}: KL(sim, llama.cpp) {r['kl_simulated_to_llamacpp']:.2g}, "
              f"KL(fp32, sim) {r['kl_fp32_to_simulated']:.3g}, KL(fp32, llama.cpp) "
              f"{r['kl_fp32_to_llamacpp']:.3g}, argmax {r['argmax_agreement']:.3f}, "
              f"position 0 {r['position0_max_abs_diff_rel']:.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
