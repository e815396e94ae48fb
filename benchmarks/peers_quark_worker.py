"""AMD Quark's mixed-precision search on this CPU, run by benchmarks/peers_quark.py in Quark's own
venv (`$AUTOPLAN_CACHE/peers/quark`).

Two steps, each recorded: (1) its managed search (`MixPrecisionQuantizer.search`, which
quantizes, exports and evaluates each candidate through vLLM) on the model's HF folder, to find
out whether it runs without an Instinct GPU (its error is kept), and (2) Quark's own candidate
order for an MI300X (`mix_precision.searcher.ConfigSearcher`, the prior that sorts module-group
configs from the most conservative to the most aggressive; pure Python, loaded without the
package's vLLM-importing __init__).

argv: one JSON object {"hf": folder, "out": path}. Writes {"configs": [...], "search_error":
"..." | None, "versions": {...}} to "out".
"""

import json
import sys
import traceback


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _searcher():  # noqa: ANN202 - (ConfigSearcher, config module)
    """Quark's ConfigSearcher and config module, loaded without the mix_precision package's
    __init__ (which imports the vLLM plugin and fails where vLLM is absent)."""
    import importlib
    import importlib.util
    import types

    name = "quark.experimental.torch.mix_precision"
    if name not in sys.modules or not hasattr(sys.modules[name], "ConfigSearcher"):
        folder = importlib.util.find_spec("quark.experimental.torch").submodule_search_locations[0]
        pkg = types.ModuleType(name)
        pkg.__path__ = [f"{folder}/mix_precision"]
        sys.modules[name] = pkg
    config = importlib.import_module(f"{name}.config")
    return importlib.import_module(f"{name}.searcher").ConfigSearcher, config


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out = {"configs": [], "search_error": None}
    try:
        import quark

        out["versions"] = {"amd-quark": getattr(quark, "__version__", "?")}
        try:  # the managed search, as quark-quant-perf runs it
            from quark.experimental.torch.mix_precision import (MixPrecisionConfig,
                                                                MixPrecisionQuantizer)

            quantizer = MixPrecisionQuantizer(MixPrecisionConfig(
                hardware="mi300", eval_metrics=["ppl"], eval_threshold=1.02))
            quantizer.search(cfg["hf"])
        except BaseException as exc:  # noqa: BLE001 - what stops it here is the finding
            traceback.print_exc()
            out["search_error"] = _one_line(exc)
        searcher_cls, config_mod = _searcher()
        searcher = searcher_cls(
            search_config=config_mod.ModuleSearchConfig(kv_cache_modes=["native"]),
            hardware=config_mod.HardwareTarget.MI300,
            available_partitions={"self_attn", "dense_mlp"})
        out["configs"] = [{**c, "score": searcher.compute_score(c)}
                          for c in searcher.generate_sorted_configs()]
        out["sensitivity"] = dict(searcher.sensitivity_weights)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        out["error"] = _one_line(exc)
    with open(cfg["out"], "w") as fh:
        json.dump(out, fh)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
