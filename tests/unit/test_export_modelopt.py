"""ModelOpt unified checkpoint (TensorRT-LLM, the 2:4 path), read back with safetensors.

Contract: for every FP8 layer, ``weight`` (float8_e4m3fn) x ``weight_scale`` (FP32, one per
output channel) computed in FP32 equals autoplan's simulated weight bit for bit; 2:4 layers
hold at most 2 non-zeros in every 4 consecutive inputs; hf_quant_config.json names the
quant_algo per format (MIXED_PRECISION with quantized_layers when formats differ).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from autoplan.errors import UnsupportedFormatError
from autoplan.export import export_plan
from autoplan.formats import Choice
from autoplan.quant import SimulatedLinear
from tests.unit.test_export_common import BASELINE, layer_names, make_plan, tiny_loaded

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return tiny_loaded(tmp_path_factory.mktemp("model"))


def _sim(loaded, name, choice) -> SimulatedLinear:  # noqa: ANN001
    return SimulatedLinear.from_linear(loaded.model.get_submodule(name), Choice.parse(choice))


def _check_layer(tensors, loaded, name, choice) -> None:  # noqa: ANN001
    sim = _sim(loaded, name, choice)
    w = tensors[f"{name}.weight"]
    if choice.endswith("fp8_e4m3"):
        scale = tensors[f"{name}.weight_scale"]
        assert w.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert scale.shape == (w.shape[0],)
        assert torch.equal(w.float() * scale[:, None], sim.weight), name
    elif choice.endswith("int8_wo"):
        assert w.dtype == torch.int8
        assert torch.equal(w.float() * tensors[f"{name}.weight_scale"][:, None], sim.weight)
    else:
        assert torch.equal(w.float(), sim.weight), name
    if choice.startswith("2:4"):
        nonzero = (w.float().reshape(w.shape[0], -1, 4) != 0).sum(-1)
        assert int(nonzero.max()) <= 2 and float(sim.mask.float().mean()) == 0.5, name


def _decisions(loaded, rule) -> dict[str, str]:  # noqa: ANN001
    return {n: rule(n) for n in layer_names(loaded)}


def test_two_four_fp8_export(loaded, tmp_path):
    decisions = _decisions(loaded, lambda n: BASELINE if n == "lm_head" else "2:4+fp8_e4m3")
    plan = make_plan(loaded, decisions, runtime="tensorrt-llm")
    out = export_plan(plan, loaded, "modelopt", tmp_path / "mo")
    cfg = json.loads((out / "hf_quant_config.json").read_text())
    assert cfg["producer"]["name"] == "modelopt"
    quant = cfg["quantization"]
    assert quant["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
    assert quant["kv_cache_quant_algo"] is None and quant["exclude_modules"] == ["lm_head"]
    assert "quantized_layers" not in quant and not (out / "quant_cfg.json").exists()
    assert set(cfg["sparsity"]["layers"]) == set(decisions) - {"lm_head"}
    tensors = load_file(str(out / "model.safetensors"))
    assert not any(k.endswith("input_scale") for k in tensors)  # dynamic per-token inputs
    for name, choice in decisions.items():
        _check_layer(tensors, loaded, name, choice)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def test_mixed_export(loaded, tmp_path):
    def rule(name: str) -> str:
        if name == "lm_head" or name.startswith("model.layers.1.self_attn"):
            return BASELINE
        if "self_attn" in name:
            return "dense+fp8_e4m3"
        return "dense+int8_wo" if "down_proj" in name else "2:4+fp8_e4m3"

    decisions = _decisions(loaded, rule)
    plan = make_plan(loaded, decisions, runtime="tensorrt-llm")
    out = export_plan(plan, loaded, "modelopt", tmp_path / "mo")
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "MIXED_PRECISION"
    layers = quant["quantized_layers"]
    assert set(layers) == {n for n, c in decisions.items() if c != BASELINE}
    assert layers["model.layers.0.mlp.down_proj"] == {"quant_algo": "W8A16"}
    assert layers["model.layers.0.mlp.up_proj"] == {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}
    assert set(quant["exclude_modules"]) == {n for n, c in decisions.items() if c == BASELINE}
    per_layer = json.loads((out / "quant_cfg.json").read_text())
    assert per_layer["quantized_layers"] == layers
    tensors = load_file(str(out / "model.safetensors"))
    for name, choice in decisions.items():
        _check_layer(tensors, loaded, name, choice)


def test_int4_refused_with_the_fix(loaded, tmp_path):
    decisions = _decisions(loaded, lambda n: BASELINE if n == "lm_head" else "dense+int4_g128")
    plan = make_plan(loaded, decisions, runtime="tensorrt-llm")
    with pytest.raises(UnsupportedFormatError, match="--format compressed-tensors"):
        export_plan(plan, loaded, "modelopt", tmp_path / "mo")
    assert not (tmp_path / "mo").exists()


def test_a_plan_that_changes_nothing_is_refused(loaded, tmp_path):
    """Like compressed-tensors: an all-16-bit plan with no sparsity and no KV scales would be
    the original model under a ModelOpt header; 2:4 alone is a checkpoint of its own."""
    plan = make_plan(loaded, _decisions(loaded, lambda n: BASELINE), runtime="tensorrt-llm")
    with pytest.raises(UnsupportedFormatError, match="quantizes no layer, sparsifies none"):
        export_plan(plan, loaded, "modelopt", tmp_path / "mo")
    assert not (tmp_path / "mo").exists()
    sparse = _decisions(loaded, lambda n: BASELINE if n == "lm_head" else "2:4+bf16")
    out = export_plan(make_plan(loaded, sparse, runtime="tensorrt-llm"), loaded, "modelopt",
                      tmp_path / "sparse")
    assert json.loads((out / "hf_quant_config.json").read_text())["sparsity"]["layers"]
