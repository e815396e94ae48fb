"""AMD Quark's mixed-precision search on this CPU, run by benchmarks/peers_quark.py in Quark's own
venv (`$AUTOPLAN_CACHE/peers/quark`).

Two steps, each recorded: (1) Quark's own candidate order for an MI300X
(`mix_precision.searcher.ConfigSearcher`, the prior that sorts module-group configs from the
most conservative to the most aggressive; pure Python), and (2) its managed search
(`MixPrecisionQuantizer.search`, which quantizes, exports and evaluates each candidate through
vLLM) on the model's HF folder, to find out whether it runs without an Instinct GPU.

argv: one JSON object {"hf": folder, "out": path}. Writes {"configs": [...], "search_error":
"..." | None, "versions": {...}} to "out".
"""

import json
import sys
import traceback


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out = {"configs": [], "search_error": None}
    try:
        import quark
        from quark.experimental.torch.mix_precision import MixPrecisionConfig, MixPrecisionQuantizer
        from quark.experimental.torch.mix_precision.config import HardwareTarget, ModuleSearchConfig
        from quark.experimental.torch.mix_precision.searcher import ConfigSearcher

        out["versions"] = {"amd-quark": getattr(quark, "__version__", "?")}
        search_config = ModuleSearchConfig(kv_cache_modes=["native"])
        searcher = ConfigSearcher(search_config=search_config, hardware=HardwareTarget.MI300,
                                  available_partitions={"self_attn", "dense_mlp"})
        out["configs"] = [{**c, "score": searcher.compute_score(c)}
                          for c in searcher.generate_sorted_configs()]
        out["sensitivity"] = dict(searcher.sensitivity_weights)
        try:
            quantizer = MixPrecisionQuantizer(MixPrecisionConfig(
                hardware="mi300", eval_metrics=["ppl"], eval_threshold=1.02))
            quantizer.search(cfg["hf"])
        except BaseException as exc:  # noqa: BLE001 - what stops it here is the finding
            traceback.print_exc()
            out["search_error"] = _one_line(exc)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        out["error"] = _one_line(exc)
    with open(cfg["out"], "w") as fh:
        json.dump(out, fh)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
