"""vLLM agreement checks (autoplan/engines/vllm_check.py) on a tiny in-process Llama, without
the engine: the layer check against engine outputs built to be right or wrong, the noise
draws, the agreement rule computed by hand, and the worker's layer-probe plumbing."""

from __future__ import annotations

import pytest
import torch

from autoplan.engines.vllm_check import (
    BF16_ROUNDING,
    agreement,
    bf16_model,
    check_layer,
    int8_pairs_saturate,
    layer_inputs,
    mean_nll,
    noise_draws,
    onednn_u8s8_pairs,
    reference_logprobs,
    simulated_model,
)
from autoplan.engines.vllm_engine import _read_layer_outputs, _write_layer_inputs, serve_command
from autoplan.quant.activations import quantize_activation_codes
from autoplan.quant.simulated_linear import SimulatedLinear
from tests.unit.test_export_common import make_plan, tiny_loaded, uniform

pytest.importorskip("compressed_tensors")

PROMPTS = [[1, 5, 9, 14, 3, 7, 22, 8], [2, 40, 6, 11, 90, 4, 17, 33]]
NAME = "model.layers.0.mlp.down_proj"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    loaded = tiny_loaded(tmp_path_factory.mktemp("model"))
    plan = make_plan(loaded, uniform(loaded, "dense+int8"), target="epyc-9654")
    return simulated_model(plan, loaded)


def _engine_like(layer, x, *, scale=1.0):  # noqa: ANN001, ANN202
    """What a W8A8 engine returns: the exact int32-accumulated result rounded to bf16 (x
    ``scale``: a wrong weight scale), with its own int8 input codes and scales."""
    y = (layer(x.float()).float() * scale).bfloat16().float()
    codes, params, _ = quantize_activation_codes(x.float(), layer.choice.precision)
    return {"y": y, "codes": codes.reshape(x.shape), "scales": params.scale.reshape(-1),
            "kernel": "CPUInt8ScaledMMLinearKernel", "path": "_apply_weights_onednn"}


def test_layer_check_passes_a_faithful_kernel_and_catches_a_wrong_scale(sim):
    x = layer_inputs(sim, PROMPTS, [NAME])[NAME]
    assert x.dtype == torch.bfloat16 and x.shape[0] == sum(map(len, PROMPTS))
    layer = sim.get_submodule(NAME)
    good = check_layer(layer, x, _engine_like(layer, x))
    assert good["exact_within_bf16"] and good["codes_equal"] == 1.0
    assert good["rel_l2"] <= BF16_ROUNDING / 2  # one rounding: at most half an ulp
    bad = check_layer(layer, x, _engine_like(layer, x, scale=1.02))
    assert not bad["exact_within_bf16"] and bad["rel_l2"] > 4 * BF16_ROUNDING
    # codes off by more than one (an int16-saturating dot product, a wrong scale rule)
    wrong = _engine_like(layer, x)
    wrong["codes"] = (wrong["codes"].to(torch.int16) // 2).to(torch.int8)
    assert not check_layer(layer, x, wrong)["exact_within_bf16"]


def test_bf16_model_keeps_the_quantized_weights_exact(sim):
    twin = bf16_model(sim)
    q, q2 = sim.get_submodule(NAME), twin.get_submodule(NAME)
    assert isinstance(q2, SimulatedLinear) and q2.weight.dtype == torch.float32
    assert torch.equal(q.weight, q2.weight)
    assert twin.model.norm.weight.dtype == torch.bfloat16
    assert sim.model.norm.weight.dtype == torch.float32  # the original is untouched


def test_noise_draws_are_seeded_small_perturbations(sim):
    ref = reference_logprobs(sim, PROMPTS)
    a = noise_draws(sim, PROMPTS, [[], []], seeds=(1, 2))
    b = noise_draws(sim, PROMPTS, [[], []], seeds=(1,))
    assert set(a) == {"bf16", "noise1", "noise2"}
    assert a["noise1"] == b["noise1"]  # same seed, same draw
    lp = [x for r in ref for x in r["prompt_logprobs"] if x is not None]
    dn = [x for r in a["noise1"] for x in r["prompt_logprobs"] if x is not None]
    assert max(abs(u - v) for u, v in zip(lp, dn, strict=True)) < 0.5
    assert all(not m._forward_pre_hooks for m in sim.modules())  # hooks removed


def _res(lps: list[float]) -> list[dict]:
    return [{"prompt_logprobs": [None, *lps], "tokens": [], "logprobs": [], "margins": []}]


def test_agreement_is_the_worst_draw_plus_the_unquantized_floor():
    """sim -1,-2,-3; draws at mean |d| 0.1 and 0.2; floor 0.05 -> tolerance 0.25.
    Engine at mean |d| 0.2 agrees; at 0.3 it does not."""
    sim = _res([-1.0, -2.0, -3.0])
    draws = {"bf16": _res([-1.1, -2.1, -3.1]), "noise1": _res([-1.2, -2.2, -2.8])}
    ok = agreement(_res([-1.2, -1.8, -3.2]), sim, draws, 0.05)
    assert ok["sim_noise_floor"] == pytest.approx(0.2)
    assert ok["tolerance"] == pytest.approx(0.25) and ok["agrees"]
    assert not agreement(_res([-1.3, -1.7, -3.3]), sim, draws, 0.05)["agrees"]
    assert mean_nll(sim) == pytest.approx(2.0)


def test_layer_inputs_travel_to_the_worker_and_back(tmp_path):
    xs = {NAME: torch.randn(3, 8).bfloat16()}
    paths, out = _write_layer_inputs(xs, tmp_path)
    from safetensors.torch import load_file, save_file

    assert torch.equal(load_file(paths[NAME])["x"], xs[NAME])
    save_file({f"y:{NAME}": torch.ones(3, 4)}, out)  # what the worker writes
    got = _read_layer_outputs({NAME: {"kernel": "K"}}, out)
    assert got[NAME]["kernel"] == "K" and got[NAME]["codes"] is None
    assert torch.equal(got[NAME]["y"], torch.ones(3, 4))


def test_serve_command_is_local_and_takes_no_removed_flag(tmp_path):
    cmd = serve_command(tmp_path, 8123, served_name="plan", python="/bin/true")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "8123" in cmd
    assert "--disable-log-requests" not in cmd  # vLLM 0.32: "unrecognized arguments"
    assert "--no-trust-remote-code" in cmd


def test_onednn_pairs_equal_int32_until_a_pair_passes_int16():
    # no pair can pass 32767 (2 * (20 + 128) * 100 = 29600: the +128 shift makes even small
    # inputs large), so the kernel's accumulators are the exact ones
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-20, 21, (5, 64), generator=g, dtype=torch.int8)
    w = torch.randint(-100, 101, (7, 64), generator=g, dtype=torch.int8)
    exact = x.long() @ w.long().T
    assert torch.equal(onednn_u8s8_pairs(x, w), exact)
    # one pair by hand: x = (127, 127), w = (127, 127) -> (255*127)*2 = 64770 saturates to
    # 32767, minus the shift 128 * 254 = 32512: 255, where the exact product is 32258
    x2 = torch.tensor([[127, 127]], dtype=torch.int8)
    w2 = torch.tensor([[127, 127]], dtype=torch.int8)
    assert int(onednn_u8s8_pairs(x2, w2)) == 32767 - 128 * 254 == 255
    assert int(x2.long() @ w2.long().T) == 32258


def test_layer_check_under_pair_saturation_tells_the_two_kernels_apart(sim):
    x = layer_inputs(sim, PROMPTS, [NAME])[NAME] * 64  # large inputs: codes near +-127
    layer = sim.get_submodule(NAME)
    exact_engine = _engine_like(layer, x)
    codes = exact_engine["codes"].reshape(x.shape[0], -1)
    acc = onednn_u8s8_pairs(codes, layer.quantized.codes)
    assert not torch.equal(acc, codes.long() @ layer.quantized.codes.long().T)  # it saturates
    saturating_engine = dict(exact_engine, y=(
        acc.double() * exact_engine["scales"].double().reshape(-1, 1)
        * layer.quantized.scales["weight_scale"].double().reshape(1, -1)).bfloat16().float())
    good = check_layer(layer, x, saturating_engine, int8_pairs_saturate=True)
    assert good["exact_within_bf16"] and good["saturated_outputs"] > 0
    assert not check_layer(layer, x, exact_engine, int8_pairs_saturate=True)["exact_within_bf16"]
    assert not check_layer(layer, x, saturating_engine)["exact_within_bf16"]


def test_int8_pairs_saturate_reads_the_workers_cpu_flags():
    assert int8_pairs_saturate({"flags": ["avx2"]})
    assert not int8_pairs_saturate({"flags": ["avx2", "avx512f", "avx512_vnni"]})
    assert not int8_pairs_saturate({"flags": ["avx2", "avx_vnni"]})
    assert not int8_pairs_saturate({})  # not x86 (or an old worker): no claim
