"""fp8_b128, DeepSeek-V3-style block FP8: the format added as one FormatSpec (issue 14).

* Weights: bit for bit compressed-tensors' ``QuantizationStrategy.BLOCK`` with block_structure
  [128, 128] (the library's ``FP8_BLOCK`` preset): its ``calculate_qparams`` on each tile's
  min/max, then its ``quantize`` / ``dequantize``, on ragged shapes and an all-zero tile.
* Inputs: bit for bit vLLM's ``per_token_group_quant_fp8`` (transcribed below from its CUDA
  kernel) and compressed-tensors' dynamic GROUP 128 fake quantization where the two agree.
* Export: a compressed-tensors checkpoint read back by the library and by transformers holds
  autoplan's codes, block scales and weights exactly; shapes vLLM cannot load are refused.
* Planning: vLLM offers it on Ada/Hopper/Blackwell only, for layers whose both dims are
  multiples of 128, at 8 + 32/16384 bits per weight.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from autoplan.cost.configs import resolve_config
from autoplan.errors import UnsupportedFormatError
from autoplan.export import export_plan
from autoplan.formats import Choice, Precision, format_spec
from autoplan.quant import (
    SimulatedLinear,
    hessian_from_inputs,
    quantize_activation,
    quantize_activation_codes,
    quantize_weight,
)
from autoplan.runtimes import supports
from autoplan.search import build_space
from autoplan.targets import get_target

P = Precision.FP8_B128
ct = pytest.importorskip("compressed_tensors.quantization")


def _ct_args():  # noqa: ANN202 - library types
    scheme = ct.preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    return scheme.weights, scheme.input_activations


def _weights(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.02
    w[:128, 128:256] = 0.0  # an all-zero tile
    w[rows - 1, 5] = 0.9  # one outlier sets a tile's scale
    return w


@pytest.mark.parametrize("shape", [(256, 384), (300, 256), (64, 128)])
def test_weights_are_compressed_tensors_block_rule_bit_for_bit(shape):
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    from compressed_tensors.quantization.utils import (
        calculate_qparams,
        maybe_pad_tensor_for_block_quant,
    )

    args, _ = _ct_args()
    assert (args.strategy, args.block_structure, args.num_bits) == ("block", [128, 128], 8)
    w = _weights(*shape)
    padded = maybe_pad_tensor_for_block_quant(w, args.block_structure)
    tiles = padded.reshape(padded.shape[0] // 128, 128, padded.shape[1] // 128, 128)
    scale, zp = calculate_qparams(tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3)), args)
    codes = quantize(w, scale, zp, args, dtype=torch.float8_e4m3fn)

    q = quantize_weight(w, P)
    stored = q.scales["weight_scale"]
    assert stored.dtype == torch.float32 and stored.shape == (-(-shape[0] // 128), shape[1] // 128)
    assert torch.equal(stored, scale)
    assert q.codes.dtype == torch.float8_e4m3fn
    assert torch.equal(q.codes.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(q.dequant, dequantize(codes, scale, zp, args))
    if shape[1] >= 256:  # the zero tile: scale eps, codes and weights exactly zero
        assert stored[0, 1] == torch.finfo(torch.float32).eps and not q.dequant[:128, 128:256].any()


def test_bf16_weights_keep_fp32_block_scales():
    """A bf16 model's block scales are FP32 (vLLM's BlockQuantScaleParameter, DeepSeek's
    weight_scale_inv): the library's rule on the weight's exact fp32 values."""
    from compressed_tensors.quantization.utils import calculate_qparams

    args, _ = _ct_args()
    w = _weights(256, 256, seed=3).to(torch.bfloat16)
    tiles = w.float().reshape(2, 128, 2, 128)
    scale, _ = calculate_qparams(tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3)), args)
    q = quantize_weight(w, P)
    assert torch.equal(q.scales["weight_scale"], scale)
    assert q.dequant.dtype == torch.float32  # the block-scaled GEMM applies scales in fp32


def test_gptq_keeps_the_block_layout_and_lowers_the_error():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(512, 256, generator=gen) * torch.linspace(0.2, 3.0, 256)
    w = torch.randn(256, 256, generator=gen) * 0.05
    rtn = quantize_weight(w, P)
    gptq = quantize_weight(w, P, method="gptq", hessian=hessian_from_inputs(x))
    scale = gptq.scales["weight_scale"]
    assert scale.shape == (2, 2)
    per_weight = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(gptq.codes.float() * per_weight, gptq.dequant)
    err = lambda q: float(((x @ (w - q.dequant).T) ** 2).mean())  # noqa: E731
    assert err(gptq) < err(rtn)


def _vllm_per_token_group_quant_fp8(x: torch.Tensor, group: int = 128
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM csrc/quantization/w8a8/fp8/per_token_group_quant.cu, transcribed: per group, in
    float32, ``local_absmax = fmaxf(eps, |x|...)`` with eps = 1e-10 (the Python wrapper's
    default), ``y_s = local_absmax / max_8bit``, ``q = fminf(fmaxf(x / y_s, min), max)``
    cast to __nv_fp8_e4m3 (round to nearest even)."""
    xf = x.float().reshape(x.shape[0], -1, group)
    absmax = torch.maximum(xf.abs().amax(dim=-1, keepdim=True), torch.tensor(1e-10))
    y_s = absmax / 448.0
    q = torch.clamp(xf / y_s, -448.0, 448.0).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), y_s.squeeze(-1)


def _activations() -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, 512, generator=gen) * torch.logspace(-3, 1, 512)
    x[1, :128] = 0.0  # all-zero group: scale eps / 448, codes 0
    x[2, 128:256] *= 1e-12  # amax below eps: eps sets the scale
    x[3, 300] = 1000.0  # an outlier in its group only
    return x.to(torch.bfloat16)


def test_inputs_are_vllm_per_token_group_quant_bit_for_bit():
    x = _activations()
    want_q, want_s = _vllm_per_token_group_quant_fp8(x)
    codes, params, _ = quantize_activation_codes(x, P)
    assert codes.dtype == torch.float8_e4m3fn
    assert torch.equal(codes.view(torch.uint8), want_q.view(torch.uint8))
    assert params.scale.shape == (6, 4) and torch.equal(params.scale, want_s)
    assert params.scale[1, 0] == torch.tensor(1e-10) / 448.0
    sim = quantize_activation(x.float(), P)
    assert torch.equal(sim, (want_q.float().reshape(6, 4, 128) * want_s[..., None]).reshape(6, 512))
    # per-token scaling (fp8_e4m3's) would round the small groups to other codes
    per_token, _, _ = quantize_activation_codes(x, Precision.FP8_E4M3)
    assert not torch.equal(per_token.view(torch.uint8), codes.view(torch.uint8))


def test_vllms_torch_native_group_quant_differs_only_below_amax_one_512th():
    """vLLM's QuantFP8._quantize_group_native (the torch path, taken when the custom op is
    off under torch.compile) floors the scale at 1 / (448 * 512) instead of flooring amax at
    1e-10: the same codes for every group whose amax >= 1/512, other codes below."""
    x = _activations()
    xf = x.float().reshape(6, -1, 128)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = (amax / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    native = torch.clamp(xf / scale, -448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    codes, _, _ = quantize_activation_codes(x, P)
    same = (native == codes.reshape(6, -1, 128).view(torch.uint8)).all(dim=-1)
    big = amax.squeeze(-1) >= 1.0 / 512.0
    assert bool(same[big].all()) and big.sum() > 10
    assert not bool(same[~big & (amax.squeeze(-1) > 0)].all())


def test_inputs_agree_with_compressed_tensors_dynamic_group_fake_quant():
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    _, args = _ct_args()
    assert (args.strategy, args.group_size, args.dynamic) == ("group", 128, True)
    x = _activations().float()
    x[2, 128:256] = 0.5  # the library floors an all-zero group differently; keep amax >= eps
    x[1, :128] = 0.25
    scale, zp = compute_dynamic_scales_and_zp(value=x, args=args, module=torch.nn.Module())
    _, params, _ = quantize_activation_codes(x, P)
    assert torch.equal(params.scale, scale)
    assert torch.equal(quantize_activation(x, P), fake_quantize(x, scale, zp, args))


# ---- export ---------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):  # noqa: ANN201
    from tests.unit.test_export_common import tiny_loaded

    return tiny_loaded(tmp_path_factory.mktemp("wide"), hidden=256, intermediate=384)


def test_compressed_tensors_export_reads_back_bit_exact(wide, tmp_path):
    from tests.unit.test_export_common import make_plan, uniform
    from tests.unit.test_export_compressed_tensors import (
        _check_weights,
        _library_read_back,
        _read_back,
    )

    plan = make_plan(wide, uniform(wide, "dense+fp8_b128"))
    out = export_plan(plan, wide, "compressed-tensors", tmp_path / "ct")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "float-quantized" and qcfg["ignore"] == ["lm_head"]
    (group,) = qcfg["config_groups"].values()
    assert group["weights"]["strategy"] == "block"
    assert group["weights"]["block_structure"] == [128, 128]
    acts = group["input_activations"]
    assert (acts["strategy"], acts["group_size"], acts["dynamic"]) == ("group", 128, True)
    sims = {n: SimulatedLinear.from_linear(wide.model.get_submodule(n), Choice.parse(c))
            for n, c in plan.decisions.items()}
    tensors = load_file(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.gate_proj"  # 384 x 256: 3 x 2 tiles
    assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn
    assert torch.equal(tensors[f"{name}.weight"].view(torch.uint8),
                       sims[name].quantized.codes.view(torch.uint8))
    assert torch.equal(tensors[f"{name}.weight_scale"], sims[name].quantized.scales["weight_scale"])
    assert tensors[f"{name}.weight_scale"].shape == (3, 2)
    _check_weights(_library_read_back(out), sims)
    _check_weights(_read_back(out), sims)


def test_shapes_vllm_cannot_load_are_refused_before_writing(tmp_path):
    from tests.unit.test_export_common import make_plan, tiny_loaded

    narrow = tiny_loaded(tmp_path / "m")  # hidden 64: no layer fills a 128-wide block
    name = "model.layers.0.mlp.down_proj"
    plan = make_plan(narrow, {name: "dense+fp8_b128"})
    with pytest.raises(UnsupportedFormatError, match=rf"{name} cannot be stored as fp8_b128 "
                       r"for vLLM: 64 outputs, not a multiple of its block \(128\)"):
        export_plan(plan, narrow, "compressed-tensors", tmp_path / "ct")
    assert not (tmp_path / "ct").exists()
    for fmt in ("modelopt", "onnx"):
        with pytest.raises(UnsupportedFormatError, match="fp8_b128"):
            format_spec(P).exported_as(fmt)


# ---- planning -------------------------------------------------------------------------------
def test_vllm_serves_it_on_ada_hopper_blackwell_only():
    choice = Choice.parse("dense+fp8_b128")
    served = {t: supports(get_target(t), "vllm", choice).ok
              for t in ("l40s", "h100-sxm", "h200", "b200", "b300", "a100-80g", "mi300x",
                        "xeon-8480")}
    assert served == {"l40s": True, "h100-sxm": True, "h200": True, "b200": True, "b300": True,
                      "a100-80g": False, "mi300x": False, "xeon-8480": False}
    assert "CUTLASS" in supports(get_target("h100-sxm"), "vllm", choice).reason
    assert not supports(get_target("h100-sxm"), "tensorrt-llm", choice).ok


def test_search_offers_it_where_the_blocks_tile_the_layers():
    choice = Choice.parse("dense+fp8_b128")
    assert choice.bits_per_weight() == 8 + 32 / (128 * 128)
    llama = build_space(resolve_config("llama-3.1-8b"), get_target("h100-sxm"), "vllm")
    assert all(choice in u.choices for u in llama.units)  # 4096 / 1024 / 14336: all tile
    smollm = build_space(resolve_config("smollm2-135m"), get_target("h100-sxm"), "vllm")
    assert choice not in smollm.all_choices  # hidden 576 is not a multiple of 128
    assert "dense+fp8_e4m3" in map(str, smollm.all_choices)
