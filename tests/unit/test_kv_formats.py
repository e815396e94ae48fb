"""KV-cache formats: numerics by their definitions, bits, and which engine serves which."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoplan.errors import UnknownNameError, UnsupportedFormatError, UserInputError
from autoplan.formats.kv import KvFormat, kv_formats, kv_spec, parse_kv_mix
from autoplan.runtimes import (check_kv_layers, default_kv, kv_of_mix, kv_supports, load_matrix,
                               served_kv_formats)
from autoplan.targets import get_target, load_references


def _kv(seed: int = 0, heads: int = 3, tokens: int = 40, dim: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, heads, tokens, dim, generator=g) * 3
    x[0, 1, 5, 7] = 250.0  # an outlier channel, as K after RoPE has
    return x


def test_every_format_is_registered_with_its_bits() -> None:
    assert [s.format for s in kv_formats()] == list(KvFormat)
    bits = {s.name: s.bits for s in kv_formats()}
    assert bits == {"fp32": 32, "bf16": 16, "fp16": 16, "fp8_e4m3": 8, "fp8_e4m3_head": 8,
                    "fp8_e5m2": 8, "int8": 8, "nvfp4": 4.5, "q8_0": 8.5, "q4_0": 4.5}


def test_parse_aliases_and_unknown_names() -> None:
    assert KvFormat.parse("FP8") is KvFormat.FP8_E4M3
    assert KvFormat.parse("fp8/head") is KvFormat.FP8_E4M3_HEAD
    assert KvFormat.parse("f16") is KvFormat.FP16
    with pytest.raises(UnknownNameError, match="q8_0"):
        KvFormat.parse("q8")


def test_fp8_per_tensor_is_x_over_scale_cast_to_e4m3() -> None:
    x = _kv()
    amax = x.abs().amax()
    spec = kv_spec("fp8_e4m3")
    scale = spec.calibrate(amax.reshape(1))
    assert torch.equal(scale, (amax / 448).reshape(1))
    want = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
    assert torch.equal(spec.quantize(x, scale), want)


def test_fp8_per_head_scales_each_kv_head_apart() -> None:
    x = _kv()
    amax = x.abs().amax(dim=(0, 2, 3))  # one per KV head
    spec = kv_spec("fp8_e4m3_head")
    scale = spec.calibrate(amax)
    got = spec.quantize(x, scale)
    for h in range(x.shape[1]):
        s = scale[h]
        want = (x[:, h] / s).to(torch.float8_e4m3fn).float() * s
        assert torch.equal(got[:, h], want)
    # finer scales: no larger error than one scale for the whole tensor
    tensor = kv_spec("fp8_e4m3").quantize(x, kv_spec("fp8_e4m3").calibrate(x.abs().amax()[None]))
    assert (got - x).square().sum() <= (tensor - x).square().sum()


def test_static_formats_refuse_to_run_without_scales() -> None:
    with pytest.raises(UserInputError, match="calibrated scales"):
        kv_spec("fp8_e4m3").quantize(_kv())


def test_int8_multiplies_by_the_reciprocal_and_saturates() -> None:
    x = _kv()
    s = torch.tensor([0.5])
    got = kv_spec("int8").quantize(x, s)
    want = torch.round(x * (1 / s)).clamp(-128, 127) * s
    assert torch.equal(got, want)
    assert got.max() == 127 * 0.5 and got.min() >= -128 * 0.5


def test_e5m2_is_an_unscaled_cast() -> None:
    x = _kv()
    assert torch.equal(kv_spec("fp8_e5m2").quantize(x), x.to(torch.float8_e5m2).float())


def _ggml_q8_0_rows(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's x86 quantize_row_q8_0 then dequantize_row_q8_0, written out in numpy:
    per 32 values d = amax / 127 (stored fp16), codes rne(x * (127 / amax))."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(blocks * inv).astype(np.float32)
    d16 = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    return (q * d16).reshape(x.shape)


def test_q8_0_cache_rows_match_ggml_cpu_quantize_row_q8_0() -> None:
    x = _kv(1)
    got = kv_spec("q8_0").quantize(x)
    assert np.array_equal(got.numpy(), _ggml_q8_0_rows(x.numpy()))


def test_q4_0_cache_rows_match_gguf_quants() -> None:
    gguf = pytest.importorskip("gguf")
    x = _kv(2)
    got = kv_spec("q4_0").quantize(x)
    rows = x.numpy().reshape(-1, x.shape[-1])
    q = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q4_0)
    want = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_0).reshape(x.shape)
    assert np.array_equal(got.numpy(), want)


def test_gguf_caches_need_head_dim_in_whole_blocks() -> None:
    with pytest.raises(UserInputError, match="head_dim divisible by 32"):
        kv_spec("q8_0").quantize(_kv(dim=48))


def test_nvfp4_cache_has_16_value_blocks_and_a_global_scale() -> None:
    x = _kv(3)
    spec = kv_spec("nvfp4")
    g = spec.calibrate(x.abs().amax()[None])
    got = spec.quantize(x, g)
    blocks = got.reshape(-1, 16)
    # every block is an E4M3 scale times E2M1 values, over the global scale
    assert torch.isfinite(got).all() and got.shape == x.shape
    assert (got - x).abs().max() < x.abs().max() / 4
    assert blocks.shape[-1] == 16


def test_exporter_names() -> None:
    assert kv_spec("fp8_e4m3").naming("compressed-tensors")["strategy"] == "tensor"
    assert kv_spec("fp8_e4m3_head").naming("compressed-tensors")["strategy"] == "attn_head"
    assert kv_spec("fp8_e4m3").naming("modelopt") == "FP8"
    assert kv_spec("q8_0").naming("gguf") == "q8_0"
    assert kv_spec("fp16").naming("gguf") == "f16"


# ---- the runtime matrix's KV rules ---------------------------------------------------------
def test_every_kv_rule_has_a_source() -> None:
    refs = load_references()
    for rt in load_matrix().runtime:
        for rule in (*rt.kv_deny, *rt.kv):
            assert rule.source in refs and rule.reason


@pytest.mark.parametrize(("target", "runtime", "served"), [
    ("h100", "vllm", {"bf16", "fp16", "fp8_e4m3", "fp8_e4m3_head", "fp8_e5m2"}),
    ("h100", "tensorrt-llm", {"bf16", "fp16", "fp8_e4m3", "int8"}),
    ("b200", "tensorrt-llm", {"bf16", "fp16", "fp8_e4m3", "int8", "nvfp4"}),
    ("a100", "vllm", {"bf16", "fp16"}),
    ("mi300x", "vllm", {"bf16", "fp16", "fp8_e4m3"}),
])
def test_served_formats(target: str, runtime: str, served: set[str]) -> None:
    assert {k.value for k in served_kv_formats(get_target(target), runtime)} == served


def test_refusals_carry_the_engines_reason() -> None:
    h100 = get_target("h100")
    nvfp4 = kv_supports(h100, "tensorrt-llm", "nvfp4")
    assert not nvfp4 and "Blackwell" in nvfp4.reason
    int8 = kv_supports(h100, "vllm", "int8")
    assert not int8 and "fp8_e4m3" in int8.reason  # says what it does serve


def test_query_rounding_and_defaults() -> None:
    assert kv_supports(get_target("h100"), "vllm", "fp8_e4m3").query is KvFormat.FP8_E4M3
    assert kv_supports(get_target("b200"), "vllm", "fp8_e4m3").query is None
    assert kv_supports(get_target("xeon-8480"), "llama.cpp", "q4_0").query is KvFormat.Q8_0
    assert default_kv(get_target("h100"), "vllm") is KvFormat.BF16
    assert default_kv(get_target("xeon-8480"), "llama.cpp") is KvFormat.FP16
    assert default_kv(get_target("xeon-8480"), "onnxruntime") is KvFormat.FP32


def test_one_kv_type_per_model_is_enforced() -> None:
    check_kv_layers("vllm", {0: KvFormat.FP8_E4M3, 1: KvFormat.FP8_E4M3})
    with pytest.raises(UnsupportedFormatError, match="one KV-cache type"):
        check_kv_layers("vllm", {0: KvFormat.FP8_E4M3, 1: KvFormat.BF16})


def test_a_per_block_mix_is_read_and_refused_on_one_type_engines() -> None:
    assert parse_kv_mix("fp8,q8_0") is None  # plain formats: alternatives, not a mix
    mix = parse_kv_mix("fp8@0-1, bf16@2")
    assert mix == {0: KvFormat.FP8_E4M3, 1: KvFormat.FP8_E4M3, 2: KvFormat.BF16}
    for bad, needle in (("fp8@1-0", "backwards"), ("fp8@0,bf16@0", "twice"),
                        ("fp8@a", "FORMAT@BLOCKS"), ("fp8@0,bf16", "FORMAT@BLOCKS")):
        with pytest.raises(UserInputError, match=needle):
            parse_kv_mix(bad)
    # every block named with one format, or the rest at the engine's own: one type
    assert kv_of_mix("vllm", {0: KvFormat.BF16}, 2, KvFormat.BF16) is KvFormat.BF16
    assert kv_of_mix("vllm", {0: KvFormat.FP8_E4M3, 1: KvFormat.FP8_E4M3}, 2,
                     KvFormat.BF16) is KvFormat.FP8_E4M3
    for runtime in ("vllm", "llama.cpp", "tensorrt-llm", "sglang"):
        with pytest.raises(UnsupportedFormatError, match="one KV-cache type for the whole"):
            kv_of_mix(runtime, {0: KvFormat.FP8_E4M3}, 2, KvFormat.BF16)
    with pytest.raises(UserInputError, match="blocks 0-1"):
        kv_of_mix("vllm", {2: KvFormat.FP8_E4M3}, 2, KvFormat.BF16)


def test_vllm_cpu_fp8_cache_needs_avx512_as_vllm_says() -> None:
    assert kv_supports(get_target("xeon-8480"), "vllm", "fp8").ok
    arm = kv_supports(get_target("graviton4"), "vllm", "fp8")
    assert not arm and "AVX-512 or AMX" in arm.reason
