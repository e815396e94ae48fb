"""`autoplan export --format onnx` writes the plan's own weights and codes (GPTQ, SparseGPT),
not a second magnitude-prune + round-to-nearest of the original weights."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.compress import CompressionSettings, collect_stats, compressed_copy
from autoplan.export import export_plan
from autoplan.formats import Choice
from tests.unit.test_export_common import calibration, layer_names, make_plan, tiny_loaded

onnx = pytest.importorskip("onnx")


@pytest.mark.parametrize("quant,prune,choice", [("gptq", "magnitude", "int4_g32"),
                                                ("gptq", "magnitude", "int4a8_g32"),
                                                ("rtn", "sparsegpt", "channel@25+int8a8_g128")])
def test_onnx_export_holds_the_plans_weights_exactly(tmp_path, quant, prune, choice):
    from autoplan.backends.cpu.onnx_export import CpuArtifact
    from autoplan.backends.cpu.ort_quant import dequantized_weights, records_from_manifest

    loaded, calib = tiny_loaded(tmp_path), calibration()
    decisions = {n: choice for n in layer_names(loaded)}
    stats = collect_stats(loaded.model, decisions, calib)
    plan = make_plan(loaded, decisions, target="xeon-8480", runtime="onnxruntime", quant=quant,
                     prune=prune, stats=stats)
    out = export_plan(plan, loaded, "onnx", tmp_path / "cpu", calibration=calib)
    art = CpuArtifact.load(out)
    got = dequantized_weights(onnx.load(str(art.model_path)), records_from_manifest(art.manifest))
    choices = {n: Choice.parse(c) for n, c in decisions.items()}
    _, sims = compressed_copy(loaded.model, choices, stats, CompressionSettings(prune, quant))
    for name, sim in sims.items():
        # Both sides are the same codes x the same scales: equal bit for bit.
        np.testing.assert_array_equal(got[name], sim.weight.numpy().T)
