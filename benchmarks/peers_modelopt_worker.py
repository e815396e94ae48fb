"""ModelOpt AutoQuantize on this CPU, run by benchmarks/peers_modelopt.py in the ModelOpt peer's
own venv (`$AUTOPLAN_CACHE/peers/modelopt`): `mtq.auto_quantize` with the gradient method on the
model's HF folder and autoplan's calibration blocks, once per effective_bits constraint.

argv: one JSON object {"hf": folder, "calib_npy": int64 [n, seq] tokens, "formats": [ModelOpt
config names], "effective_bits": [...], "checkpoint": path, "out": path} (the checkpoint holds
ModelOpt's search state: the calibration and scores of the first run serve every later one). Writes {"runs": {bits: {"recipes":
{module: recipe name}, "wall_s", "best": ...}}, "versions": ...} to "out"; on failure the
JSON holds {"error": "Type: first line"} and the exit code is 1.
"""

import json
import sys
import time
import traceback


def _recipe_name(recipe) -> str:  # noqa: ANN001 - a ModelOpt QuantRecipe
    for attr in ("name", "config_name"):
        if isinstance(getattr(recipe, attr, None), str):
            return getattr(recipe, attr)
    return str(recipe)


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out = {"runs": {}}
    try:
        import numpy as np
        import torch
        import modelopt
        import modelopt.torch.quantization as mtq
        from transformers import AutoModelForCausalLM

        out["versions"] = {"modelopt": modelopt.__version__, "torch": torch.__version__}
        tokens = torch.from_numpy(np.load(cfg["calib_npy"])).long()
        batches = [{"input_ids": tokens[i:i + 1], "labels": tokens[i:i + 1]}
                   for i in range(tokens.shape[0])]
        formats = [getattr(mtq, name) for name in cfg["formats"]]
        for bits in cfg["effective_bits"]:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_pretrained(cfg["hf"], torch_dtype=torch.float32)
            t0 = time.perf_counter()
            model, state = mtq.auto_quantize(
                model, constraints={"effective_bits": bits}, quantization_formats=formats,
                data_loader=batches, forward_step=lambda m, b: m(**b),
                loss_func=lambda output, b: output.loss, num_calib_steps=len(batches),
                num_score_steps=len(batches), disabled_layers=["*lm_head*"], verbose=True,
                checkpoint=cfg["checkpoint"])  # scores computed once, reused for each bits
            best = state.get("best", {}) if isinstance(state, dict) else {}
            recipes = {name: _recipe_name(r) for name, r in (best.get("recipe") or {}).items()}
            out["runs"][str(bits)] = {
                "recipes": recipes, "wall_s": time.perf_counter() - t0,
                "best": {k: (v if isinstance(v, int | float | str) else str(v))
                         for k, v in best.items() if k != "recipe"},
                "candidate_stats": str(state.get("candidate_stats", ""))[:20000]
                if isinstance(state, dict) else ""}
            print(f"effective_bits {bits}: {len(recipes)} recipes in "
                  f"{out['runs'][str(bits)]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - one line back to the caller, the trace to stderr
        traceback.print_exc()
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    with open(cfg["out"], "w") as fh:
        json.dump(out, fh)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
