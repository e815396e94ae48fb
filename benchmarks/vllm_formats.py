"""Which compressed-tensors formats does vLLM's CPU build load, and does it compute them as
autoplan simulated? (issue 11 item 1)

For every format autoplan's compressed-tensors exporter writes, a uniform plan on the
embedded SmolLM2-135M (every block linear in the format, lm_head kept bf16) is exported
and loaded with ``vllm.LLM(model=DIR)`` in the vLLM engine's venv; the result is vLLM's own
error text, or, when it loads, the two checks of autoplan/engines/vllm_check.py:

* layer check: o_proj / down_proj layers (block 0 and a middle block, one per format
  present) run once through vLLM's own kernel on the simulation's real inputs, against the
  plan's SimulatedLinear: exact up to one bf16 rounding of the output (rel. L2 <= 2^-8) and
  the same int8 input codes;
* model check: teacher-forced logprobs vs the simulation, within the plan's own noise floor
  (the simulation in bf16 and with 1e-7 input noise, several seeds) plus vLLM's bf16 floor on
  the unquantized model; greedy tokens; the NLL the quantization adds, in vLLM vs simulated.

Mixed plans (searched ones with --mixed-plan, and fixed mixes of the formats vLLM CPU runs)
are checked the same way. The result records the CPU's ISA flags and the vLLM C++ library
it loaded: vLLM CPU's kernels depend on them.

    python benchmarks/vllm_formats.py [--mixed-plan A.json,B.json]  # -> results/vllm_formats.json

Exports go to a temp folder (or --keep DIR). Needs `autoplan engines install vllm`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import cpu_flags, start_run, write_result  # noqa: E402

TEMPLATE = Path(__file__).with_name("results") / "cpu_plans" / "int8_kl0.05.json"
EXPORT_TARGET = "b200"  # a target the runtime matrix lets every vLLM format through on, so
# the CPU engine itself is asked; the checkpoint does not depend on the target.
PROBE_BLOCKS = (0, 15)  # blocks whose o_proj / down_proj the layer check runs in vLLM


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/vllm_formats.json")
    p.add_argument("--prompts", type=int, default=6, help="pydoc text blocks")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--dtype", default="bfloat16", help="vLLM's activation dtype")
    p.add_argument("--formats", default="", help="comma list (default: every one the "
                   "compressed-tensors exporter writes; none: only the mixed plans)")
    p.add_argument("--no-fixed-mixes", action="store_true",
                   help="skip the fixed mixed plans (check --mixed-plan ones only)")
    p.add_argument("--mixed-plan", default="",
                   help="searched plan files to check too (comma list)")
    p.add_argument("--keep", default="", help="keep the exports in this folder")
    p.add_argument("--noise-seeds", default="1,2,3", help="seeds of the simulation's noise draws")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def exported_formats() -> list[str]:
    """Every quantized format the compressed-tensors exporter writes (not Refused)."""
    from autoplan.formats import registered_formats
    from autoplan.formats.registry import Refused

    return [s.name for s in registered_formats()
            if s.quantized and not isinstance(s.naming("compressed-tensors"), Refused)]


def _target_for(fmt: str) -> str:
    """EXPORT_TARGET, or h100 for a format the matrix stops below Blackwell (mxfp4_wo)."""
    from autoplan.formats import Choice
    from autoplan.runtimes import supports
    from autoplan.targets import get_target

    return next((name for name in (EXPORT_TARGET, "h100")
                 if supports(get_target(name), "vllm", Choice.parse(fmt)).ok), EXPORT_TARGET)


def _plan(template, decisions: dict[str, str], target: str):  # noqa: ANN001, ANN202
    from autoplan.plan.schema import RuntimeRef

    return template.model_copy(update={
        "decisions": decisions, "runtime": RuntimeRef(name="vllm", version="0.32"),
        "target": template.target.model_copy(update={"name": target}),
        "audit": template.audit.model_copy(update={"tensors": {}})})


def _uniform(loaded, fmt: str) -> dict[str, str]:  # noqa: ANN001
    """``fmt`` on every block linear its group divides (SmolLM2's 576 inputs are not a
    multiple of 128: g128 formats go on down_proj only), the rest and lm_head in bf16."""
    from autoplan.formats import format_spec

    group = format_spec(fmt).info.group

    def pick(layer) -> str:  # noqa: ANN001
        fits = not group or layer.in_features % group == 0
        return f"dense+{fmt}" if layer.name != "lm_head" and fits else "dense+bf16"

    return {layer.name: pick(layer) for layer in loaded.spec.layers}


def _mixed_int8(loaded) -> dict[str, str]:  # noqa: ANN001
    """W8A8 INT8 everywhere except down_proj and lm_head (bf16): two kernels, one checkpoint."""
    return {layer.name: "dense+bf16" if layer.name == "lm_head"
            or layer.name.endswith("down_proj") else "dense+int8" for layer in loaded.spec.layers}


def _mixed(loaded) -> dict[str, str]:  # noqa: ANN001
    """Attention in W8A8 INT8, gate/up in symmetric W4A16 g64, down in uint4 g128 (zero
    points), lm_head bf16: three vLLM CPU kernels in one checkpoint."""
    def pick(name: str) -> str:
        if name == "lm_head":
            return "dense+bf16"
        if ".self_attn." in name:
            return "dense+int8"
        return "dense+uint4_g128" if name.endswith("down_proj") else "dense+int4_g64"

    return {layer.name: pick(layer.name) for layer in loaded.spec.layers}


def _prompts(loaded, n: int, length: int) -> list[list[int]]:  # noqa: ANN001
    from autoplan.quality.text import load_text_dataset

    data = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=length, n_calib=0,
                             n_eval=n, seed=0)
    return [row.tolist() for row in data.eval.reshape(-1, length)[:n]]


def probe_layers(plan) -> list[str]:  # noqa: ANN001
    """The layers the layer check runs in vLLM: the unfused ones (vLLM fuses q/k/v and
    gate/up) in PROBE_BLOCKS and lm_head, plus the first unfused layer of every quantized
    format that those miss (a mixed plan's)."""
    unfused = [n for n in plan.decisions if n.endswith(("o_proj", "down_proj", "lm_head"))]
    names = [n for n in unfused if n == "lm_head" or any(f"layers.{b}." in n
                                                         for b in PROBE_BLOCKS)]
    seen = {plan.decisions[n] for n in names}
    for n in unfused:
        if plan.decisions[n] not in seen:
            names.append(n)
            seen.add(plan.decisions[n])
    return [n for n in names if not plan.decisions[n].endswith(("+bf16", "+fp32", "+fp16"))]


def check(name: str, plan, ctx: dict, args, folder: Path) -> dict:  # noqa: ANN001
    """Export, load in vLLM, run both checks; one row of the table."""
    from collections import Counter

    from autoplan.engines.vllm_check import (
        agreement,
        check_layer,
        compare,
        int8_pairs_saturate,
        layer_inputs,
        mean_nll,
        noise_draws,
        reference_logprobs,
        simulated_model,
    )
    from autoplan.engines.vllm_engine import run_vllm
    from autoplan.errors import AutoplanError
    from autoplan.export import export_plan

    loaded, prompts = ctx["loaded"], ctx["prompts"]
    row: dict = {"formats": dict(Counter(d.split("+")[1] for d in plan.decisions.values()))}
    calib = ctx["calibration"] if any("nvfp4" in d for d in plan.decisions.values()) else None
    out = folder / name
    try:
        export_plan(plan, loaded, "compressed-tensors", out, calibration=calib)
        sim_model = simulated_model(plan, loaded, calibration=calib)
    except AutoplanError as exc:
        return {**row, "exported": False, "loads": False, "error": f"autoplan: {exc}"}
    row["exported"] = True
    names = probe_layers(plan)
    xs = layer_inputs(sim_model, prompts[:2], names)
    t0 = time.perf_counter()
    run = run_vllm(out, prompts, max_tokens=args.new_tokens, dtype=args.dtype, layers=xs)
    row.update(loads=run.ok, vllm_s=round(time.perf_counter() - t0, 1),
               load_avg_1m=round(os.getloadavg()[0], 2))
    if not run.ok:
        row.update(stage=run.stage, error=run.error)
        print(f"{name}: vLLM refused at {run.stage}: {row['error'][:200]}")
        return row
    conts = [r["tokens"] for r in run.results]
    sim = reference_logprobs(sim_model, prompts, conts)
    draws = noise_draws(sim_model, prompts, conts, seeds=ctx["seeds"])
    agree = agreement(run.results, sim, draws, ctx["floor"])
    saturate = int8_pairs_saturate(run.cpu)
    layers = {n: check_layer(sim_model.get_submodule(n), xs[n], run.layers[n],
                             int8_pairs_saturate=saturate) for n in names}
    cmp = compare(run.results, sim)
    row.update(
        cmp, model_check=agree, layer_check=layers, cpu=run.cpu, versions=run.versions,
        layers_exact=all(v["exact_within_bf16"] for v in layers.values()),
        quant_effect_lp_abs_mean=compare([{**r, "tokens": []} for r in ctx["orig_sim"]],
                                         sim)["prompt_lp_abs_mean"],
        nll_added={"vllm": mean_nll(run.results) - ctx["nll_vllm_orig"],
                   "simulated": mean_nll(sim) - ctx["nll_fp32_orig"]})
    row["agrees"] = bool(agree["agrees"] and row["layers_exact"])
    worst = max((v["rel_l2"] for v in layers.values()), default=float("nan"))
    print(f"{name}: loads; mean |d lp| {agree['engine_vs_sim']:.4f} vs tolerance "
          f"{agree['tolerance']:.4f} (sim noise {agree['sim_noise_floor']:.4f}); layers rel L2 "
          f"<= {worst:.2e} exact={row['layers_exact']}; greedy {cmp['greedy_same']}/"
          f"{cmp['greedy_total']}; NLL added vLLM {row['nll_added']['vllm']:+.4f} sim "
          f"{row['nll_added']['simulated']:+.4f}")
    return row


def _baseline(loaded, prompts, args) -> dict:  # noqa: ANN001
    """The unquantized model in vLLM vs autoplan fp32: the engine's bf16 noise floor (and
    the original's logprobs, to size what each plan's quantization changes). The same model
    run by autoplan in bf16 (vllm_check.bf16_model) checks that bf16 explains that floor."""
    from autoplan.engines.vllm_check import bf16_model, compare, mean_nll, reference_logprobs
    from autoplan.engines.vllm_engine import run_vllm

    run = run_vllm(loaded.path, prompts, max_tokens=args.new_tokens, dtype=args.dtype)
    if not run.ok:
        raise SystemExit(f"error: vLLM could not load the original model: {run.error}")
    conts = [r["tokens"] for r in run.results]
    ref = reference_logprobs(loaded.model, prompts, conts)
    ours_bf16 = reference_logprobs(bf16_model(loaded.model), prompts, conts)
    return {"loads": True, **compare(run.results, ref), "versions": run.versions,
            "cpu": run.cpu, "autoplan_bf16_vs_fp32":
            compare([{**r, "tokens": []} for r in ours_bf16], ref)["prompt_lp_abs_mean"],
            "nll_vllm": mean_nll(run.results), "nll_fp32": mean_nll(ref), "_ref": ref}


def _markdown(doc: dict) -> str:
    base = doc["baseline"]
    lines = [f"Unquantized model, vLLM {doc['dtype']} vs autoplan fp32: mean |d logprob| "
             f"{base['prompt_lp_abs_mean']:.4f} (autoplan's own bf16 run: "
             f"{base['autoplan_bf16_vs_fp32']:.4f}), greedy {base['greedy_same']}/"
             f"{base['greedy_total']}.", "",
             "| plan | loads | layer check: rel. L2 (max) / int8 codes equal | mean \\|d lp\\| "
             "vLLM vs sim | tolerance (sim noise + floor) | quantization moves | NLL added "
             "vLLM / sim | greedy | agrees | vLLM's error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in doc["plans"].items():
        if not r.get("loads"):
            err = r.get("error", "").replace("|", "/")[:300]
            lines.append(f"| {name} | no | | | | | | | | {err} |")
            continue
        lc = r["layer_check"].values()
        codes = [v["codes_equal"] for v in lc if "codes_equal" in v]
        code_txt = f" / {min(codes):.6f}" if codes else ""
        m = r["model_check"]
        lines.append(
            f"| {name} | yes | {max(v['rel_l2'] for v in lc):.2e}{code_txt} | "
            f"{m['engine_vs_sim']:.4f} | {m['tolerance']:.4f} ({m['sim_noise_floor']:.4f} + "
            f"{m['unquantized_floor']:.4f}) | {r['quant_effect_lp_abs_mean']:.4f} | "
            f"{r['nll_added']['vllm']:+.4f} / {r['nll_added']['simulated']:+.4f} | "
            f"{r['greedy_same']}/{r['greedy_total']} | {'yes' if r['agrees'] else 'no'} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    from autoplan.engines import engine_python
    from autoplan.engines.serving import stop_on_signals
    from autoplan.errors import AutoplanError
    from autoplan.models import load_model
    from autoplan.plan.io import load_plan
    from autoplan.quality.text import load_text_dataset

    stop_on_signals()  # SIGTERM/SIGHUP stop the vLLM worker too
    try:
        engine_python("vllm")  # a missing engine is one line before minutes of work
        searched = {Path(f).name: load_plan(f) for f in args.mixed_plan.split(",") if f}
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    from autoplan.search.preparation import CALIB_BATCH

    loaded = load_model("smollm2-135m")
    template = load_plan(TEMPLATE)
    prompts = _prompts(loaded, args.prompts, args.prompt_len)
    formats = ([] if args.formats == "none" else
               [f for f in args.formats.split(",") if f] or exported_formats())
    load0 = os.getloadavg()
    try:
        baseline = _baseline(loaded, prompts, args)
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    calib = load_text_dataset(None, tokenizer=loaded.tokenizer, seq_len=128, n_calib=4,
                              n_eval=0, seed=0).calib.split(CALIB_BATCH)
    ctx = {"loaded": loaded, "prompts": prompts, "orig_sim": baseline.pop("_ref"),
           "floor": baseline["prompt_lp_abs_mean"], "nll_vllm_orig": baseline["nll_vllm"],
           "nll_fp32_orig": baseline["nll_fp32"], "calibration": calib,
           "seeds": [int(x) for x in args.noise_seeds.split(",") if x]}
    print(f"unquantized floor: mean |d lp| {ctx['floor']:.4f} (autoplan bf16 "
          f"{baseline['autoplan_bf16_vs_fp32']:.4f}), greedy {baseline['greedy_same']}/"
          f"{baseline['greedy_total']}")
    plans = {f"uniform {f}": _plan(template, _uniform(loaded, f), _target_for(f))
             for f in formats}
    for fname, plan in searched.items():
        plans[f"searched ({fname})"] = _plan(plan, plan.decisions, EXPORT_TARGET)
    if not args.no_fixed_mixes:
        plans["mixed int8 / int4_g64 / uint4_g128"] = _plan(template, _mixed(loaded),
                                                             EXPORT_TARGET)
        plans["mixed int8 / bf16"] = _plan(template, _mixed_int8(loaded), EXPORT_TARGET)
    rows = {}
    try:
        with tempfile.TemporaryDirectory(prefix="autoplan-vllm-formats-") as tmp:
            folder = Path(args.keep) if args.keep else Path(tmp)
            for i, (name, plan) in enumerate(plans.items()):
                rows[name] = check(f"p{i}", plan, ctx, args, folder)
                rows[name]["decisions_sample"] = dict(list(plan.decisions.items())[:3])
    except AutoplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    doc = {"machine": {**info, "cpu_flags": cpu_flags()}, "command": command,
           "dtype": args.dtype, "load_avg_at_start": [round(x, 2) for x in load0],
           "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
           "prompts": {"n": len(prompts), "tokens": args.prompt_len, "source": "pydoc eval split",
                       "new_tokens": args.new_tokens},
           "agreement_rule": "layer check: rel. L2 <= 2^-8 and int8 codes equal (<= 1e-4 of "
                             "them off by one); model check: mean |d logprob| vs sim <= max "
                             "over the simulation's noise draws + the unquantized floor "
                             "(autoplan/engines/vllm_check.py)",
           "baseline": baseline, "plans": rows}
    write_result(args.out, doc)
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
