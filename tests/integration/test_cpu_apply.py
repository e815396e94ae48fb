"""CPU apply on the embedded SmolLM2-135M: export, quantize, run, and check numerics (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from autoplan.backends.cpu.ort_quant import dequantized_weights, records_from_manifest
from autoplan.backends.cpu.ort_runtime import OrtGenerator
from autoplan.bench import apply_plan_cpu, read_plan

pytestmark = pytest.mark.slow
# Logit tolerance vs the PyTorch model holding the ONNX weights (fp32 math, 30 layers,
# logits of magnitude ~20): float summation order only.
TOL = 2e-3


@pytest.fixture(scope="module")
def loaded():
    models = pytest.importorskip("autoplan.models")
    try:
        return models.load_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - the embedded model package may be absent
        pytest.skip(f"smollm2-135m not loadable here: {exc}")


def test_int4_plan_matches_torch_with_the_onnx_weights(loaded, tmp_path):
    import onnx

    decisions = {layer.name: "int4_g64" for layer in loaded.spec.layers}
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"decisions": decisions, "target": "local"}))
    art = apply_plan_cpu(loaded, read_plan(plan_path), tmp_path / "art")
    assert len(art.manifest["layers"]) == len(loaded.spec.layers)
    assert {v["op_type"] for v in art.manifest["layers"].values()} == {"MatMulNBits"}

    proto = onnx.load(str(art.model_path))
    weights = dequantized_weights(proto, records_from_manifest(art.manifest))
    import copy

    sim = copy.deepcopy(loaded.model)
    for name, module in sim.named_modules():
        if name in weights:
            module.weight = torch.nn.Parameter(torch.from_numpy(weights[name].T.copy()))
    ids = np.array([loaded.tokenizer("The capital of France is").input_ids], np.int64)
    gen = OrtGenerator(art.path)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1])[None], "logits_to_keep": np.array(
                 [ids.shape[1]]), **gen._empty_cache(1)}
    got = gen.session.run(["logits"], feeds)[0]
    with torch.no_grad():
        want = sim(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=TOL)
    tokens = gen.generate(ids, 8).tokens
    assert tokens.shape == (1, 8)
