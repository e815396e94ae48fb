"""Which compressed-tensors formats does vLLM's CPU build load, and does it compute them as
autoplan simulated? (issue 11 item 1)

For every format autoplan's compressed-tensors exporter writes, a uniform plan on the
embedded SmolLM2-135M (every block linear in the format, lm_head kept bf16) is exported
and loaded with ``vllm.LLM(model=DIR)`` in the vLLM engine's venv; the result is vLLM's own
error text, or, when it loads, teacher-forced and greedy logprobs compared with autoplan's
simulation of the same plan (autoplan/engines/vllm_check.py says why the tolerance is a
multiple of the noise floor measured on the unquantized model in the same run). A mixed
plan (a searched one when given with --mixed-plan, else a fixed three-format mix) is
checked the same way.

    python benchmarks/vllm_formats.py            # -> benchmarks/results/vllm_formats.json

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

from benchmarks._common import start_run  # noqa: E402

TEMPLATE = Path(__file__).with_name("results") / "cpu_plans" / "int8_kl0.05.json"
EXPORT_TARGET = "b200"  # a target the runtime matrix lets every vLLM format through on, so
# the CPU engine itself is asked; the checkpoint does not depend on the target.
TOL_FACTOR, TOL_ABS = 3.0, 0.02  # agreement: mean |d logprob| <= 3 x noise floor + 0.02


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/vllm_formats.json")
    p.add_argument("--prompts", type=int, default=3, help="pydoc text blocks")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--dtype", default="bfloat16", help="vLLM's activation dtype")
    p.add_argument("--formats", default="", help="comma list (default: every one the "
                   "compressed-tensors exporter writes)")
    p.add_argument("--mixed-plan", default="", help="a plan file to check as the mixed plan")
    p.add_argument("--keep", default="", help="keep the exports in this folder")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def exported_formats() -> list[str]:
    """Every quantized format the compressed-tensors exporter writes (not Refused)."""
    from autoplan.formats import registered_formats
    from autoplan.formats.registry import Refused

    return [s.name for s in registered_formats()
            if s.quantized and not isinstance(s.naming("compressed-tensors"), Refused)]


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


def _scrub(text: str) -> str:
    """No machine path in the results: temp folders and the home folder are elided."""
    for root in (tempfile.gettempdir(), str(Path.home())):
        text = text.replace(root, "...")
    return text


def check(name: str, plan, loaded, prompts, orig, args, folder: Path,  # noqa: ANN001
          noise: float | None) -> dict:
    """Export, load in vLLM, compare with the simulation; one row of the table."""
    from collections import Counter

    from autoplan.engines.vllm_engine import run_vllm
    from autoplan.engines.vllm_check import compare, reference_logprobs, simulated_model
    from autoplan.errors import AutoplanError
    from autoplan.export import export_plan

    row: dict = {"formats": dict(Counter(d.split("+")[1] for d in plan.decisions.values()))}
    out = folder / name
    try:
        export_plan(plan, loaded, "compressed-tensors", out)
    except AutoplanError as exc:
        return {**row, "exported": False, "loads": False, "error": f"autoplan: {exc}"}
    row["exported"] = True
    t0 = time.perf_counter()
    run = run_vllm(out, prompts, max_tokens=args.new_tokens, dtype=args.dtype)
    row.update(loads=run.ok, vllm_s=round(time.perf_counter() - t0, 1),
               load_avg_1m=round(os.getloadavg()[0], 2))
    if not run.ok:
        row.update(stage=run.stage, error=_scrub(run.error))
        print(f"{name}: vLLM refused at {run.stage}: {row['error'][:200]}")
        return row
    sim = reference_logprobs(simulated_model(plan, loaded), prompts,
                             [r["tokens"] for r in run.results])
    cmp = compare(run.results, sim)
    effect = compare([{**r, "tokens": []} for r in orig], sim)["prompt_lp_abs_mean"]
    row.update(cmp, quant_effect_lp_abs_mean=effect, versions=run.versions)
    if noise is not None:
        row["tolerance"] = TOL_FACTOR * noise + TOL_ABS
        row["agrees"] = cmp["prompt_lp_abs_mean"] <= row["tolerance"]
    print(f"{name}: loads; mean |d lp| {cmp['prompt_lp_abs_mean']:.4f} (max "
          f"{cmp['prompt_lp_abs_max']:.3f}), quantization moves {effect:.4f}; greedy "
          f"{cmp['greedy_same']}/{cmp['greedy_total']}")
    return row


def _baseline(loaded, prompts, args) -> tuple[dict, list]:  # noqa: ANN001
    """The unquantized model in vLLM vs autoplan fp32: the engine's arithmetic noise (and
    the original's prompt logprobs, to size what each plan's quantization changes)."""
    from autoplan.engines.vllm_engine import run_vllm
    from autoplan.engines.vllm_check import compare, reference_logprobs

    run = run_vllm(loaded.path, prompts, max_tokens=args.new_tokens, dtype=args.dtype)
    if not run.ok:
        raise SystemExit(f"vLLM could not load the original model: {run.error}")
    ref = reference_logprobs(loaded.model, prompts, [r["tokens"] for r in run.results])
    return {"loads": True, **compare(run.results, ref), "versions": run.versions}, ref


def _markdown(doc: dict) -> str:
    lines = [f"Noise floor (original fp32 folder in vLLM {doc['dtype']} vs autoplan fp32): mean "
             f"|d logprob| {doc['baseline']['prompt_lp_abs_mean']:.4f}, max "
             f"{doc['baseline']['prompt_lp_abs_max']:.3f}, greedy "
             f"{doc['baseline']['greedy_same']}/{doc['baseline']['greedy_total']}. Tolerance: "
             f"{TOL_FACTOR:g} x floor + {TOL_ABS:g} = {doc['tolerance']:.4f}.", "",
             "| plan | vLLM CPU loads | mean / max \\|d logprob\\| vs simulation | "
             "quantization moves (mean) | greedy tokens equal | agrees | vLLM's error |",
             "|---|---|---|---|---|---|---|"]
    for name, r in doc["plans"].items():
        if r.get("loads"):
            lines.append(f"| {name} | yes | {r['prompt_lp_abs_mean']:.4f} / "
                         f"{r['prompt_lp_abs_max']:.3f} | {r['quant_effect_lp_abs_mean']:.4f} | "
                         f"{r['greedy_same']}/{r['greedy_total']} | "
                         f"{'yes' if r.get('agrees') else 'no'} | |")
        else:
            err = r.get("error", "").replace("|", "/")[:300]
            lines.append(f"| {name} | no | | | | | {err} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info, command = start_run(args.seed, argv)
    from autoplan.engines import engine_python
    from autoplan.models import load_model
    from autoplan.plan.io import load_plan, write_json_atomic

    engine_python("vllm")  # a missing engine is one line before minutes of work
    loaded = load_model("smollm2-135m")
    template = load_plan(TEMPLATE)
    prompts = _prompts(loaded, args.prompts, args.prompt_len)
    formats = [f for f in args.formats.split(",") if f] or exported_formats()
    load0 = os.getloadavg()
    baseline, orig = _baseline(loaded, prompts, args)
    noise = baseline["prompt_lp_abs_mean"]
    print(f"noise floor: mean |d lp| {noise:.4f}, greedy {baseline['greedy_same']}/"
          f"{baseline['greedy_total']}")
    plans = {f"uniform {f}": _plan(template, _uniform(loaded, f), EXPORT_TARGET)
             for f in formats}
    if args.mixed_plan:
        searched = load_plan(args.mixed_plan)
        plans["mixed (searched)"] = _plan(searched, searched.decisions, EXPORT_TARGET)
    else:
        plans["mixed int8 / int4_g64 / uint4_g128"] = _plan(template, _mixed(loaded),
                                                             EXPORT_TARGET)
    plans["mixed int8 / bf16"] = _plan(template, _mixed_int8(loaded), EXPORT_TARGET)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="autoplan-vllm-formats-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        for i, (name, plan) in enumerate(plans.items()):
            rows[name] = check(f"p{i}", plan, loaded, prompts, orig, args, folder, noise)
            rows[name]["decisions_sample"] = dict(list(plan.decisions.items())[:3])
    doc = {"machine": info, "command": command, "dtype": args.dtype,
           "load_avg_at_start": [round(x, 2) for x in load0],
           "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
           "prompts": {"n": len(prompts), "tokens": args.prompt_len, "source": "pydoc eval split",
                       "new_tokens": args.new_tokens},
           "tolerance_rule": f"mean |d logprob| <= {TOL_FACTOR:g} x noise floor + {TOL_ABS:g}",
           "tolerance": TOL_FACTOR * noise + TOL_ABS, "baseline": baseline, "plans": rows}
    write_json_atomic(args.out, doc)
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
