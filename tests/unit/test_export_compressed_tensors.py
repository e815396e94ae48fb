"""compressed-tensors export, read back through the library's own reader.

Each export is loaded with transformers + ``CompressedTensorsConfig(run_compressed=False)``,
which builds the model, applies the checkpoint's ``quantization_config`` with
compressed-tensors and decompresses every layer with the library's registered compressor
(``ModelCompressor.from_compression_config`` -> ``decompress_model``). The decompressed
weights must equal autoplan's simulated weights:

The library reader (``_library_read_back``) decompresses layer by layer with the scheme
compressed-tensors matches to each module; it is the one used for the mixed plan.

* FP8, INT8, W8A16, W4A16 (symmetric and with zero points), 16-bit: bit-exact (the library
  computes ``(codes - zero point) * scale`` in FP32, the same product autoplan's
  dequantization is).
* NVFP4: the library unpacks E2M1 codes to bfloat16 and dequantizes in bfloat16, so its
  weights are autoplan's rounded once to bf16: relative error <= 2**-8. The stored codes and
  scales themselves are checked bit-exactly by recomputing ``(codes * scale) / global`` in
  FP32 from the raw safetensors.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from autoplan.export import export_plan
from autoplan.formats import Choice
from autoplan.quant import SimulatedLinear
from tests.unit.test_export_common import (
    BASELINE, calibration, layer_names, make_plan, tiny_loaded, uniform,
)

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
NVFP4_RTOL = 2.0**-8  # one bfloat16 rounding of the library's dequantized weight


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return tiny_loaded(tmp_path_factory.mktemp("model"))


def _sims(loaded, plan) -> dict[str, SimulatedLinear]:  # noqa: ANN001
    return {n: SimulatedLinear.from_linear(loaded.model.get_submodule(n), Choice.parse(c))
            for n, c in plan.decisions.items()}


def _read_back(out):  # noqa: ANN001, ANN202
    from transformers.utils.quantization_config import CompressedTensorsConfig

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32,
        quantization_config=CompressedTensorsConfig(run_compressed=False)).eval()


def _library_read_back(out) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """Per-layer weights decompressed by compressed-tensors alone, layer by layer.

    The checkpoint's config goes through ``ModelCompressor.from_compression_config``;
    ``apply_quantization_config`` matches its targets/ignore onto a fresh model, so each
    module gets the scheme the library (and vLLM) would give it; that module's tensors are
    then decompressed by the compressor registered for the scheme's format.
    """
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from transformers.utils.quantization_config import CompressedTensorsConfig

    config = transformers.AutoConfig.from_pretrained(str(out))
    qcfg = CompressedTensorsConfig.from_dict(json.loads((out / "config.json").read_text())
                                             ["quantization_config"])
    compressor = ModelCompressor.from_compression_config(qcfg)
    fresh = transformers.AutoModelForCausalLM.from_config(config)
    apply_quantization_config(fresh, compressor.quantization_config, show_progress=False)
    tensors = load_file(str(out / "model.safetensors"))
    weights = {}
    for name, module in fresh.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        local = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
        if scheme is None:
            if isinstance(module, torch.nn.Linear) and "weight" in local:
                weights[name] = local["weight"].float()
            continue
        codec = BaseCompressor.get_value_from_registry(scheme.format)
        weights[name] = codec.decompress(local, scheme)["weight"].float()
    return weights


def _check_weights(back, sims, *, nvfp4_rtol: float = 0.0) -> None:  # noqa: ANN001
    for name, sim in sims.items():
        got = back[name] if isinstance(back, dict) else back.get_submodule(name).weight.detach()
        got = got.float()
        if sim.choice.precision.value == "nvfp4":
            assert torch.all((got - sim.weight).abs() <= nvfp4_rtol * sim.weight.abs()), name
        else:
            assert torch.equal(got, sim.weight), name


@pytest.mark.parametrize("choice,fmt,scheme_key", [
    ("dense+fp8_e4m3", "float-quantized", ("float", "channel")),
    ("dense+int8", "int-quantized", ("int", "channel")),
    ("dense+int8_wo", "pack-quantized", ("int", "channel")),
    ("dense+int4_g32", "pack-quantized", ("int", "group")),
    ("dense+uint4_g32", "pack-quantized", ("int", "group")),
])
def test_uniform_exports_read_back_bit_exact(loaded, tmp_path, choice, fmt, scheme_key):
    plan = make_plan(loaded, uniform(loaded, choice))
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "compressed-tensors" and qcfg["format"] == fmt
    assert qcfg["ignore"] == ["lm_head"]
    (group,) = qcfg["config_groups"].values()
    assert (group["weights"]["type"], group["weights"]["strategy"]) == scheme_key
    assert group["weights"]["symmetric"] is (choice != "dense+uint4_g32")
    assert sorted(group["targets"]) == sorted(n for n in layer_names(loaded) if n != "lm_head")
    if choice in ("dense+int4_g32", "dense+uint4_g32"):
        assert group["weights"]["group_size"] == 32 and group["input_activations"] is None
    if choice in ("dense+fp8_e4m3", "dense+int8"):
        acts = group["input_activations"]
        assert acts["dynamic"] is True and acts["strategy"] == "token"
    _check_weights(_read_back(out), _sims(loaded, plan))
    _check_weights(_library_read_back(out), _sims(loaded, plan))


def test_nvfp4_codes_exact_and_library_dequant_within_bf16(loaded, tmp_path):
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    plan = make_plan(loaded, uniform(loaded, "dense+nvfp4"), target="b200")
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct",
                      calibration=calibration())
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "nvfp4-pack-quantized"
    sims = _sims(loaded, plan)
    tensors = load_file(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    packed = tensors[f"{name}.weight_packed"]
    codes = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2,
                                  dtype=torch.float32)
    scale = tensors[f"{name}.weight_scale"]
    assert scale.dtype == torch.float8_e4m3fn
    g = tensors[f"{name}.weight_global_scale"]
    deq = (codes.reshape(codes.shape[0], -1, 16) * scale.float().unsqueeze(-1)).reshape(
        codes.shape) / g
    assert torch.equal(deq, sims[name].weight)
    assert tensors[f"{name}.input_global_scale"].item() > 0
    _check_weights(_read_back(out), sims, nvfp4_rtol=NVFP4_RTOL)
    _check_weights(_library_read_back(out), sims, nvfp4_rtol=NVFP4_RTOL)


def test_mixed_plan_has_one_group_per_scheme(loaded, tmp_path):
    decisions = {}
    for name in layer_names(loaded):
        if name == "lm_head" or name.startswith("model.layers.1.self_attn"):
            decisions[name] = BASELINE
        elif "self_attn" in name:
            decisions[name] = "dense+fp8_e4m3"
        elif "down_proj" in name:
            decisions[name] = "dense+int8_wo"
        else:
            decisions[name] = "dense+int4_g32"
    plan = make_plan(loaded, decisions)
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "mixed-precision"
    groups = list(qcfg["config_groups"].values())
    assert len(groups) == 3
    formats = {g["format"] for g in groups}
    assert formats == {"float-quantized", "pack-quantized"}
    targets = {t for g in groups for t in g["targets"]}
    assert targets == {n for n, c in decisions.items() if c != BASELINE}
    assert set(qcfg["ignore"]) == {n for n, c in decisions.items() if c == BASELINE}
    # transformers 5.24's dequantizing loader decompresses every dense layer with the first
    # config group's scheme, so mixed checkpoints are read with the library alone (vLLM
    # matches each layer to its own group, as the library does).
    _check_weights(_library_read_back(out), _sims(loaded, plan))


@pytest.mark.parametrize("choice,target,preset_acts", [
    ("dense+mxfp4_wo", "h100", None),  # W4A16: Marlin FP4 below Blackwell
    ("dense+mxfp4", "b200", "float"),  # W4A4: MXFP4 inputs on Blackwell
])
def test_mxfp4_exports_hold_the_codes_and_e8m0_scales_bit_exact(loaded, tmp_path, choice,
                                                                   target, preset_acts):
    """compressed-tensors' own MXFP4 presets (mxfp4-pack-quantized): E2M1 codes packed two
    per byte and the E8M0 exponent bytes autoplan computed, which the library decompresses
    to autoplan's weights exactly (a power-of-two scale times an E2M1 value is exact in
    bf16)."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    from autoplan.formats.elements import decode_e8m0

    plan = make_plan(loaded, uniform(loaded, choice), target=target)
    out = export_plan(plan, loaded, "compressed-tensors", tmp_path / "ct")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "mxfp4-pack-quantized"
    (group,) = qcfg["config_groups"].values()
    assert (group["weights"]["type"], group["weights"]["group_size"]) == ("float", 32)
    acts = group["input_activations"]
    assert (acts and acts["type"]) == preset_acts
    sims = _sims(loaded, plan)
    tensors = load_file(str(out / "model.safetensors"))
    for name, sim in sims.items():
        if name == "lm_head":
            continue
        packed, scale = tensors[f"{name}.weight_packed"], tensors[f"{name}.weight_scale"]
        assert scale.dtype == torch.uint8
        assert torch.equal(scale, sim.quantized.scales["weight_scale"]), name
        codes = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2,
                                      dtype=torch.float32)
        deq = codes * decode_e8m0(scale).repeat_interleave(32, dim=1)
        assert torch.equal(deq, sim.weight), name
    _check_weights(_library_read_back(out), sims)
