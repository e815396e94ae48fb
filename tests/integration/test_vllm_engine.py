"""vLLM CPU loads autoplan's compressed-tensors export of the embedded model and computes it
as simulated: the one fast engine check (one `vllm.LLM` load, ~1-2 min on 2 cores). Skipped
with the install command when the vLLM engine is absent; benchmarks/vllm_formats.py is the
full per-format run."""

from __future__ import annotations

import pytest

from autoplan.engines import engine_status
from tests.integration._embedded import needs_embedded

pytestmark = [pytest.mark.slow, needs_embedded,
              pytest.mark.skipif(not engine_status("vllm").installed,
                                 reason="the vLLM engine is not installed: "
                                        "`autoplan engines install vllm`")]

LAYERS = ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj"]


def test_vllm_runs_a_w8a8_export_as_simulated(tmp_path):
    from autoplan.engines.vllm_check import (
        BF16_ROUNDING,
        check_layer,
        compare,
        int8_pairs_saturate,
        layer_inputs,
        reference_logprobs,
        simulated_model,
    )
    from autoplan.engines.vllm_engine import run_vllm
    from autoplan.export import export_plan
    from autoplan.models import load_model
    from autoplan.plan.io import load_plan
    from autoplan.plan.schema import RuntimeRef

    loaded = load_model("smollm2-135m")
    template = load_plan("benchmarks/results/cpu_plans/int8_kl0.05.json")
    decisions = {layer.name: "dense+bf16" if layer.name == "lm_head" else "dense+int8"
                 for layer in loaded.spec.layers}
    plan = template.model_copy(update={
        "decisions": decisions, "runtime": RuntimeRef(name="vllm", version="0.32"),
        "target": template.target.model_copy(update={"name": "epyc-9654"}),
        "audit": template.audit.model_copy(update={"tensors": {}})})
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "int8")
    sim = simulated_model(plan, loaded)
    prompt = loaded.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number")
    prompts = [prompt["input_ids"]]
    xs = layer_inputs(sim, prompts, LAYERS)
    run = run_vllm(out, prompts, max_tokens=4, layers=xs)
    assert run.ok, run.error
    # vLLM's int8 GEMM is the simulation's up to one bf16 rounding where the CPU has int32
    # dot products (VNNI/AMX); without them it is oneDNN's int16-saturating one, emulated
    saturate = int8_pairs_saturate(run.cpu)
    got = {name: check_layer(sim.get_submodule(name), xs[name], run.layers[name],
                             int8_pairs_saturate=saturate) for name in LAYERS}
    for name in LAYERS:
        assert got[name]["exact_within_bf16"], (name, got[name])
    if saturate:  # why runtimes.toml refuses vLLM int8 on AVX2: the format is not what runs
        o_proj = got["model.layers.0.self_attn.o_proj"]
        assert o_proj["saturated_outputs"] > 0 and o_proj["rel_l2"] > 2 * BF16_ROUNDING, o_proj
    cmp = compare(run.results, reference_logprobs(sim, prompts, [r["tokens"] for r in
                                                                 run.results]))
    assert cmp["greedy_same"] >= 1  # the first token has a clear margin on this prompt
    assert cmp["prompt_lp_abs_mean"] < 0.5  # chaos floor ~0.2 (vllm_check.py), wiring errors >> 1
