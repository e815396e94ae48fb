"""Section `nncf` of benchmarks/peers.py: NNCF's mixed INT4/INT8 weight compression (its `ratio`
of INT4 layers, chosen by its sensitivity metric) run by OpenVINO GenAI, against autoplan's
`--target local --runtime onnxruntime` plan at the KL NNCF reaches, run by ONNX Runtime.

NNCF side: `optimum-cli export openvino --weight-format int4 --group-size 32 --ratio R
--sensitivity-metric weight_quantization_error` (the data-free metric: optimum-cli's
data-aware metrics need a Hub dataset; layers NNCF leaves out of INT4 go to INT8, its backup
precision, and the tied embedding/lm_head stays INT8), in the openvino engine's venv.
autoplan side: `autoplan search --target local --runtime onnxruntime --budget kl<=KL_NNCF` and
`autoplan export --format onnx`. KL: each runtime's own logits (OpenVINO's CPU plugin with its
defaults, ONNX Runtime) against the same fp32 reference on the search's evaluation blocks.
Speed: autoplan.bench.run_bench, every side interleaved batch by batch, same threads.
"""

from __future__ import annotations

from pathlib import Path

from peers_common import autoplan, error_row, peers_dir
from peers_table import floor_budget, pair

GOAL = 1.1
RATIOS = (1.0, 0.8, 0.6)
METRIC = "weight_quantization_error"
GROUP = 32


def _nncf_irs(loaded, log) -> tuple[Path, dict[str, dict]]:  # noqa: ANN001
    from openvino_side import convert

    from autoplan.engines import engine_python

    python = engine_python("openvino")
    out = {}
    for ratio in RATIOS:
        extra = ("--ratio", str(ratio), "--sensitivity-metric", METRIC)
        name = f"nncf-int4-r{ratio:g}"
        log(f"optimum-cli export openvino int4 ratio {ratio} (cached) ...")
        ir = convert(python, loaded.path, loaded.content_hash, "int4", GROUP, extra)
        out[name] = {"ir": ir, "ratio": ratio, "command":
                     "optimum-cli export openvino --model HF_FOLDER --task "
                     f"text-generation-with-past --weight-format int4 --group-size {GROUP} "
                     f"--ratio {ratio:g} --sensitivity-metric {METRIC} OUT"}
    return python, out


def _plan(budget: str, args, log) -> tuple[Path, str]:  # noqa: ANN001
    folder = peers_dir() / "nncf" / f"plan_{budget.replace('kl<=', 'kl')}"
    # not with_suffix: "plan_kl0.175" has a suffix (".175"), and every budget shared one file
    plan, art = folder.parent / f"{folder.name}.json", folder
    search = ["search", "--model", "smollm2-135m", "--target", "local", "--runtime",
              "onnxruntime", "--batch", "1", "--input-len", str(args.input_len), "--output-len",
              str(args.output_len), "--budget", budget, "--objective", args.objective,
              "--threads", str(args.threads), "--out", str(plan), "--quiet"]
    export = ["export", str(plan), "--format", "onnx", "--out", str(art)]
    folder.parent.mkdir(parents=True, exist_ok=True)
    if not plan.is_file():
        log(f"autoplan search --runtime onnxruntime {budget} ...")
        autoplan(search, f"autoplan search {budget}",
                 log=folder.parent / f"{folder.name}.search.log")
    if not (art / "model.onnx").is_file() and not any(art.glob("*.onnx")):
        autoplan(export, "autoplan export onnx",
                 log=folder.parent / f"{folder.name}.export.log")
    shown = [Path(a).name if a.startswith("/") else (f"'{a}'" if "<" in a else a)
             for a in search]
    return art, f"autoplan {' '.join(shown)} && autoplan export {plan.name} --format onnx " \
                f"--out {art.name}"


def run(args, log=print) -> dict:  # noqa: ANN001
    from openvino_side import openvino_quality, openvino_side

    from autoplan.backends.cpu.onnx_export import CpuArtifact
    from autoplan.bench import ort_side, run_bench
    from autoplan.bench.quality import artifact_quality
    from autoplan.models import load_model
    from autoplan.quality.metrics import reference_pass
    from autoplan.quality.text import load_text_dataset

    loaded = load_model("smollm2-135m")
    try:
        python, irs = _nncf_irs(loaded, log)
    except Exception as exc:  # noqa: BLE001 - the peer's own error becomes its table line
        return {"section": "nncf", "rows": [], "pairs": [],
                "errors": [error_row("nncf", "NNCF / OpenVINO GenAI", exc)]}
    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=256, n_calib=4,
                             n_eval=6, seed=0)
    ref = reference_pass(loaded.model, data.eval)
    rows, peers = [], {}
    for name, p in irs.items():
        q = openvino_quality(python, p["ir"], ref, args.threads)
        peers[name] = {**p, "quality": q}
        log(f"{name}: KL {q['kl']:.4f} through OpenVINO ({q['inference_precision']}, dynamic "
            f"quantization group {q['dynamic_quantization_group_size']})")
    # kept if the run is stopped before the timing: sizes and KL, measured, speed not yet
    getattr(args, "progress", {}).update({"section": "nncf", "threads": args.threads, "rows": [
        _peer_row(name, p) for name, p in peers.items()], "pairs": [], "errors": []})
    plans: dict[str, dict] = {}
    for name, p in peers.items():
        budget = f"kl<={floor_budget(p['quality']['kl'])}"
        if budget not in plans:
            art, command = _plan(budget, args, log)
            plans[budget] = {"art": CpuArtifact.load(art), "command": command}
            plans[budget]["quality"] = artifact_quality(plans[budget]["art"].model_path, ref,
                                                        threads=args.threads)
        p["budget"] = budget
    sides = [openvino_side(python, p["ir"], name, args.threads) for name, p in peers.items()]
    sides += [ort_side(f"autoplan-{b.replace('kl<=', 'kl')}", p["art"], args.threads)
              for b, p in plans.items()]
    try:
        report = run_bench(sides, requests=args.rounds, concurrency=1, input_len=args.input_len,
                           output_len=args.output_len, vocab=loaded.spec.vocab,
                           threads=args.threads, progress=log)
    finally:
        for s in sides:
            if hasattr(s.generator, "close"):
                s.generator.close()
    for name, p in peers.items():
        s = report.side(name)
        rows.append({**_peer_row(name, p), "decode_tok_s": s.decode_tok_s,
                     "prefill_tok_s": s.prefill_tok_s, "speed_kind": "measured",
                     "budget": p["budget"]})
    for budget, p in plans.items():
        name = f"autoplan-{budget.replace('kl<=', 'kl')}"
        s = report.side(name)
        rows.append({"section": "nncf", "name": name, "side": "autoplan", "budget": budget,
                     "kl": p["quality"]["kl"], "ppl": p["quality"]["ppl"],
                     "decode_tok_s": s.decode_tok_s, "prefill_tok_s": s.prefill_tok_s,
                     "file_mb": sum(f.stat().st_size for f in p["art"].path.glob("*.onnx*"))
                     / 2**20, "decisions": _summary(p["art"]), "speed_kind": "measured",
                     "command": p["command"]})
    by_name = {r["name"]: r for r in rows}
    pairs = [pair(r, by_name[f"autoplan-{r['budget'].replace('kl<=', 'kl')}"], GOAL)
             for r in rows if r["side"] == "peer"]
    return {"section": "nncf", "threads": args.threads, "rows": rows, "pairs": pairs,
            "errors": [], "goal": GOAL, "bench": report.to_json(),
            "workload": {"batch": 1, "input_len": args.input_len,
                         "output_len": args.output_len, "requests": args.rounds}}


def _peer_row(name: str, p: dict) -> dict:
    """An NNCF row's measured size and quality (its speed is added once timed)."""
    return {"section": "nncf", "name": name, "side": "peer", "peer": "NNCF",
            "ratio": p["ratio"], "metric": METRIC, "kl": p["quality"]["kl"],
            "ppl": p["quality"]["ppl"], "runtime_precisions": {
                k: p["quality"].get(k) for k in ("inference_precision", "kv_cache_precision",
                                                 "dynamic_quantization_group_size")},
            "file_mb": (p["ir"] / "openvino_model.bin").stat().st_size / 2**20,
            "command": p["command"]}


def _summary(art) -> dict[str, int]:  # noqa: ANN001
    from autoplan.backends.cpu.predict import artifact_decisions

    out: dict[str, int] = {}
    for choice in artifact_decisions(art).values():
        out[str(choice)] = out.get(str(choice), 0) + 1
    return out


__all__ = ["GOAL", "RATIOS", "run"]
