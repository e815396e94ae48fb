"""AutoRound AutoScheme to GGUF, run by benchmarks/peers_autoround.py in AutoRound's own venv
(`$AUTOPLAN_CACHE/peers/autoround`).

argv: one JSON object {"hf": folder, "calib_json": list-of-strings file, "options": [...],
"avg_bits": [...], "out_dir": folder, "iters": 0, "nsamples": n, "seqlen": n}. For each
avg_bits: AutoRound(hf, scheme=AutoScheme(avg_bits, options), iters, dataset=calib_json)
.quantize_and_save(out_dir/bBITS, format="gguf:q4_k_m"); writes {"runs": {bits: {"gguf": path,
"layer_config": {layer: scheme}, "wall_s"}}, "versions"} to out_dir/autoscheme.json; a
failure is {"error": "Type: first line"} there and exit code 1.
"""

import json
import sys
import time
import traceback
from pathlib import Path


def _short(cfg) -> str:  # noqa: ANN001 - a layer's config dict or scheme
    if isinstance(cfg, dict):
        keys = ("bits", "group_size", "sym", "super_bits", "super_group_size", "data_type")
        return ",".join(f"{k}={cfg.get(k)}" for k in keys if cfg.get(k) is not None)
    return str(cfg)


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out_dir = Path(cfg["out_dir"])
    out = {"runs": {}}
    try:
        import auto_round
        from auto_round import AutoRound, AutoScheme

        out["versions"] = {"auto-round": auto_round.__version__}
        for bits in cfg["avg_bits"]:
            dest = out_dir / f"b{bits:g}"
            t0 = time.perf_counter()
            scheme = AutoScheme(avg_bits=bits, options=tuple(cfg["options"]),
                                dataset=cfg["calib_json"], nsamples=cfg["nsamples"],
                                seqlen=cfg["seqlen"], device_map="cpu")
            ar = AutoRound(cfg["hf"], scheme=scheme, iters=cfg["iters"],
                           dataset=cfg["calib_json"], nsamples=cfg["nsamples"],
                           seqlen=cfg["seqlen"], device_map="cpu")
            ar.quantize_and_save(str(dest), format="gguf:q4_k_m")
            ggufs = sorted(dest.rglob("*.gguf"))
            if not ggufs:
                raise RuntimeError(f"AutoRound wrote no .gguf under {dest}")
            out["runs"][f"{bits:g}"] = {
                "gguf": str(ggufs[0]), "wall_s": time.perf_counter() - t0,
                "layer_config": {k: _short(v) for k, v in (ar.layer_config or {}).items()}}
            print(f"avg_bits {bits}: {ggufs[0]} in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - one line back to the caller, the trace to stderr
        traceback.print_exc()
        text = str(exc).strip().splitlines()
        out["error"] = f"{type(exc).__name__}: {text[0][:300] if text else ''}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "autoscheme.json").write_text(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
