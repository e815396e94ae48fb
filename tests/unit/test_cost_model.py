"""Hand-computed checks of the analytic cost model (autoplan/cost)."""

from __future__ import annotations

import math

import pytest

from autoplan.cost import (
    CostModel,
    Objective,
    PhaseTime,
    baseline_precision,
    family_efficiency,
    resolve_config,
    sparse24_speedup,
    usd_per_million_tokens,
)
from autoplan.cost.linear import stored_bits
from autoplan.errors import ModelConfigError, UnknownNameError, UnsupportedFormatError
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.targets import Figure, Target, get_target
from autoplan.workload import Workload


def _fig(value: float) -> Figure:
    return Figure(value=value, source="TEST")


def _toy_target(kind: str = "gpu", peaks: dict | None = None, sparse: dict | None = None) -> Target:
    """1 TB/s, 100 TF BF16 / 200 TF FP8, 80 GB, Hopper constants."""
    return Target(
        name="toy", description="toy", vendor="nvidia", kind=kind, family="hopper",
        memory_gb=_fig(80), bandwidth_gbps=_fig(1000),
        peak_tflops={k: _fig(v) for k, v in (peaks or {"bf16": 100, "fp8": 200}).items()},
        sparse24={k: _fig(v) for k, v in (sparse if sparse is not None else {"bf16": 2}).items()},
        tdp_w=_fig(500), price_per_hour=_fig(4.0),
    )


_TOY_CFG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 8192,
            "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000}


def _toy_model(batch: int = 1, input_len: int = 128, output_len: int = 64) -> CostModel:
    spec = ModelSpec.from_config(_TOY_CFG, name="toy")
    return CostModel(spec, _toy_target(), Workload(batch=batch, input_len=input_len,
                                                   output_len=output_len))


@pytest.mark.parametrize("text, bits", [("bf16", 16), ("fp8", 8), ("2:4+fp16", 9),
                                        ("2:4+fp8", 5), ("int4_g128", 4.125), ("nvfp4", 4.5),
                                        ("mxfp4", 4.25)])
def test_bits_per_weight(text: str, bits: float) -> None:
    assert Choice.parse(text).bits_per_weight() == pytest.approx(bits)


def test_unaccelerated_2to4_is_stored_dense() -> None:
    no_sparse = _toy_target(sparse={})
    assert stored_bits(no_sparse, Choice.parse("2:4+bf16")) == 16
    assert stored_bits(_toy_target(), Choice.parse("2:4+bf16")) == pytest.approx(9)
    assert stored_bits(no_sparse, Choice.parse("channel@25+bf16")) == pytest.approx(12)


def test_decode_of_bandwidth_bound_layer() -> None:
    cm = _toy_model(batch=1)
    eff = family_efficiency(cm.target)
    layer = cm.spec.layer("model.layers.0.self_attn.o_proj")  # its own fused group
    bytes_ = 4096 * 4096 * 2 + 1 * (4096 * 2 + 4096 * 2)
    expected = bytes_ / (eff.eta_bw * 1e12) + eff.kernel_s
    assert cm.layer_time(layer, cm.baseline).decode_s == pytest.approx(expected)


def test_fused_group_splits_kernel_overhead() -> None:
    cm = _toy_model(batch=1)
    eff = family_efficiency(cm.target)
    q = cm.spec.layer("model.layers.0.self_attn.q_proj")
    bytes_ = 4096 * 4096 * 2 + 4096 * 2 + 4096 * 2
    assert cm.layer_time(q, cm.baseline).decode_s == pytest.approx(
        bytes_ / (eff.eta_bw * 1e12) + eff.kernel_s / 3)


def test_compute_bound_prefill() -> None:
    cm = _toy_model(batch=4, input_len=1024)  # 4,096 tokens: one prefill chunk
    eff = family_efficiency(cm.target)
    layer = cm.spec.layer("model.layers.0.self_attn.o_proj")
    flops = 2 * 4096 * 4096 * 4096
    expected = flops / (eff.eta_c * 100e12) + eff.kernel_s
    assert cm.layer_time(layer, cm.baseline).prefill_s == pytest.approx(expected)


def test_sparse_speedup_depends_on_shape() -> None:
    h100 = get_target("h100-sxm")
    assert sparse24_speedup(64, 64, 64, "fp8", h100) < 1.0
    assert sparse24_speedup(1024, 1024, 1024, "fp8", h100) < 1.0
    assert sparse24_speedup(8192, 8192, 8192, "fp8", h100) > 1.4
    assert sparse24_speedup(8192, 8192, 8192, "fp8", _toy_target(sparse={})) == 1.0


def test_2to4_decode_is_a_byte_reduction() -> None:
    cm = _toy_model(batch=1)
    layer = cm.spec.layer("model.layers.0.mlp.down_proj")
    dense = cm.layer_time(layer, Choice.parse("bf16")).decode_s
    sparse = cm.layer_time(layer, Choice.parse("2:4+bf16")).decode_s
    assert 1.3 < dense / sparse < 16 / 9


def test_usd_per_million_tokens() -> None:
    assert usd_per_million_tokens(800, 4.0) == pytest.approx(1.3889, abs=1e-4)
    cm = _toy_model()
    tps = cm.workload.batch * cm.workload.output_len / (0.1 + 63 * 0.01)
    assert cm.metric_from_times(0.1, 0.01, Objective.COST) == pytest.approx(
        4.0 / (tps * 3600) * 1e6)
    assert cm.metric_from_times(0.1, 0.01, "latency") == pytest.approx(0.1 + 63 * 0.01)


def test_memory_fit() -> None:
    wl = Workload(batch=1, input_len=1024, output_len=256)
    big = CostModel(resolve_config("llama-3.1-70b"), get_target("h100-sxm"), wl)
    assert not big.evaluate("bf16").memory.fits  # ~141 GB of weights on 80 GB
    assert big.evaluate("bf16").memory.weights_bytes == pytest.approx(141e9, rel=0.01)
    on_h200 = CostModel(resolve_config("llama-3.1-70b"), get_target("h200"), wl)
    assert on_h200.evaluate("fp8").memory.fits
    kv = CostModel(resolve_config("llama-3.1-8b"), get_target("h100"), wl).evaluate().memory
    assert kv.kv_cache_bytes == pytest.approx(1280 * 128 * 1024)  # 128 KiB/token (hw-facts)


def test_additivity_of_step_times() -> None:
    cm = _toy_model(batch=8, input_len=256, output_len=32)
    decisions = {"model.layers.0.mlp.down_proj": Choice.parse("2:4+bf16"),
                 "model.layers.1.self_attn.o_proj": "fp8", "lm_head": "int4_g128"}
    est = cm.evaluate(decisions)
    total = cm.fixed_time()
    for layer, choice in zip(cm.spec.layers, cm.resolve(decisions)):
        total = total + cm.layer_time(layer, choice)
    assert est.metrics.prefill_s == pytest.approx(total.prefill_s, rel=1e-12)
    assert est.metrics.decode_s == pytest.approx(total.decode_s, rel=1e-12)
    assert cm.step_times(decisions) == PhaseTime(pytest.approx(total.prefill_s),
                                                 pytest.approx(total.decode_s))
    assert est.metrics.decode_tokens_per_s == pytest.approx(8 / total.decode_s)


def test_per_layer_decisions_mapping() -> None:
    cm = _toy_model()
    est = cm.evaluate({"model.layers.1.mlp.up_proj": "2:4+bf16"})
    choices = {row.name: row.choice for row in est.layers}
    assert choices["model.layers.1.mlp.up_proj"] == "2:4+bf16"
    assert choices["model.layers.0.mlp.up_proj"] == "dense+bf16"
    with pytest.raises(UnknownNameError, match="Did you mean"):
        cm.evaluate({"model.layers.1.mlp.up_prj": "fp8"})


def test_unplannable_moe_refused_naming_what_is_missing() -> None:
    moe = {**_TOY_CFG, "num_local_experts": 8, "num_experts_per_tok": 2}
    cases = {
        "deepseek_v32": "DeepSeek Sparse Attention",
        "jamba": "hybrid Mamba",
        "qwen3_next": "hybrid linear-attention",
        "dbrx": "mixture-of-experts model autoplan does not plan",
    }
    for model_type, needle in cases.items():
        with pytest.raises(ModelConfigError, match=needle):
            ModelSpec.from_config({**moe, "model_type": model_type})
    with pytest.raises(ModelConfigError, match="router scoring_func 'sigmoid'"):
        ModelSpec.from_config({**moe, "model_type": "mixtral", "scoring_func": "sigmoid"})
    with pytest.raises(ModelConfigError, match="grouped expert routing"):
        ModelSpec.from_config({**moe, "model_type": "mixtral", "n_group": 8, "topk_group": 4})
    with pytest.raises(ModelConfigError, match="more than the 8 experts"):
        ModelSpec.from_config({**moe, "model_type": "mixtral", "num_experts_per_tok": 9})
    # the config's bounds come before anything allocates per block
    with pytest.raises(ModelConfigError, match="num_hidden_layers.*10,000"):
        ModelSpec.from_config({**moe, "model_type": "mixtral", "num_hidden_layers": 10**12})
    with pytest.raises(ModelConfigError, match="655,360,000 expert groups, more than 262,144"):
        ModelSpec.from_config({**moe, "model_type": "mixtral", "num_hidden_layers": 10_000,
                               "num_local_experts": 65_536})
    with pytest.raises(ModelConfigError, match="'num_experts_per_tok'"):
        ModelSpec.from_config({**_TOY_CFG, "model_type": "mixtral", "num_local_experts": 8})


def test_unsupported_math_refused() -> None:
    cm = _toy_model()
    with pytest.raises(UnsupportedFormatError, match="fp4"):
        cm.evaluate("nvfp4")


def test_measured_row_replaces_analytic_time() -> None:
    spec = ModelSpec.from_config(_TOY_CFG)
    doc = {"schema_version": 1, "device": "toy",
           "rows": [{"m": 1, "n": 4096, "k": 4096, "choice": "bf16", "median_us": 500.0}]}
    cm = CostModel(spec, _toy_target(), Workload(batch=1), measured=doc)
    eff = family_efficiency(cm.target)
    layer = spec.layer("model.layers.0.self_attn.o_proj")
    assert cm.layer_time(layer, cm.baseline).decode_s == pytest.approx(500e-6 + eff.kernel_s)


def test_baseline_precision_per_kind() -> None:
    assert baseline_precision(get_target("h100")).value == "bf16"
    assert baseline_precision(_toy_target(kind="cpu", peaks={"fp32": 5})).value == "fp32"


def test_small_model_not_absurdly_fast() -> None:
    cm = CostModel(resolve_config("smollm2-135m"), get_target("h100"), Workload(batch=1))
    tps = cm.evaluate().metrics.decode_tokens_per_s
    # 270 MB of weights would stream in 0.12 ms (8,000 tok/s); fixed kernel costs dominate.
    assert 200 < tps < 2000
    assert math.isfinite(cm.evaluate().to_json()["metrics"]["energy"])


def test_block_quantized_activation_formats_run_as_one_kernel():
    from autoplan.cost.linear import kernels_per_call

    # W8A8 pays a separate dynamic-quantization kernel; MatMulNBits quantizes inside.
    assert kernels_per_call(Choice.parse("int8")) == 2
    assert kernels_per_call(Choice.parse("int4a8_g32")) == 1
    assert kernels_per_call(Choice.parse("int8a8_g128")) == 1
    assert kernels_per_call(Choice.parse("int4_g32")) == 1


def test_measured_cpu_target_does_not_discount_its_bandwidth_twice():
    from autoplan.cost.efficiency import family_efficiency

    spr = get_target("xeon-8480")
    assert family_efficiency(spr).eta_bw == 0.60  # a datasheet peak is discounted
    local = spr.model_copy(update={"name": "local", "family": "local-amx", "measured": True})
    assert family_efficiency(local).eta_bw == 1.0  # an achieved read rate is not
    assert family_efficiency(local).kernel_s == family_efficiency(spr).kernel_s


def test_part_bandwidth_factor_from_measured_stream_bandwidth():
    """Hopper's eta_bw was measured on the H100 SXM; the H200 (same die, HBM3e) reaches a
    smaller share of its datasheet peak in the same read-only stream benchmark (BabelStream
    Dot, Azure ND H100 v5 / ND H200 v5: 3.18 of 3.35 and 4.48 of 4.8 TB/s), so its eta_bw is
    scaled by that ratio; parts without a measured pair keep the family's row."""
    from autoplan.cost.efficiency import (
        _FAMILIES,
        _STREAM_READ,
        part_bandwidth_factor,
        replaced_family,
        transfer_row,
    )
    from autoplan.targets import load_references

    h100, h200 = get_target("h100-sxm"), get_target("h200")
    expected = (4480 / 4800) / (3180 / 3350)
    assert part_bandwidth_factor(h200) == pytest.approx(expected)
    assert 0.98 < expected < 0.99
    assert family_efficiency(h200).eta_bw == pytest.approx(_FAMILIES["hopper"].eta_bw * expected)
    assert family_efficiency(h200).eta_c == _FAMILIES["hopper"].eta_c  # bandwidth only
    assert "h200" in family_efficiency(h200).evidence
    # the reference part itself, and parts with no figure, keep the family's own row
    assert family_efficiency(h100) is _FAMILIES["hopper"]
    for name in ("h100-pcie", "a100-80g", "b200", "mi300x", "xeon-8480"):
        assert part_bandwidth_factor(get_target(name)) == 1.0
    # a held-out family's row (leave-one-family-out) is used as is
    row = transfer_row("hopper")
    assert row is not None
    with replaced_family("hopper", row):
        assert family_efficiency(h200) is row
    # every figure cites a reference key
    refs = load_references()
    assert all(fig.source in refs for fig in _STREAM_READ.values())
    # the step time follows: a memory-bound decode step on H200 is slower by ~1/factor
    spec = resolve_config("llama-3.1-8b")
    w = Workload(batch=1, input_len=128, output_len=128)
    scaled = CostModel(spec, h200, w).step_times("bf16").decode_s
    with replaced_family("hopper", _FAMILIES["hopper"]):
        plain = CostModel(spec, h200, w).step_times("bf16").decode_s
    assert plain < scaled < plain / expected * 1.001


def test_part_compute_factor_from_vendor_max_achievable_flops():
    """The MI325X has the MI300X's CUs and datasheet peak but runs a dense GEMM at a higher
    clock: AMD's max-achievable BF16 rates (708 vs 843 TFLOP/s, one harness) scale its eta_c;
    the MI300X itself, other families and parts with no figure keep their rows."""
    from autoplan.cost.efficiency import (
        _FAMILIES,
        _MAX_ACHIEVABLE,
        part_compute_factor,
        replaced_family,
        transfer_row,
    )
    from autoplan.targets import load_references

    mi300x, mi325x = get_target("mi300x"), get_target("mi325x")
    assert part_compute_factor(mi325x) == pytest.approx(843 / 708)
    eff = family_efficiency(mi325x)
    assert eff.eta_c == pytest.approx(_FAMILIES["cdna3"].eta_c * 843 / 708)
    assert eff.eta_bw == _FAMILIES["cdna3"].eta_bw and "mi325x" in eff.evidence
    assert family_efficiency(mi300x) is _FAMILIES["cdna3"]
    for name in ("mi355x", "h100-sxm", "h200", "b200", "xeon-8480"):
        assert part_compute_factor(get_target(name)) == 1.0
    # the FP8 figures give the same ratio within 1 %
    fp8 = _MAX_ACHIEVABLE["mi325x"].fp8_tflops / _MAX_ACHIEVABLE["mi300x"].fp8_tflops
    assert fp8 == pytest.approx(843 / 708, rel=0.01)
    assert all(fig.source in load_references() for fig in _MAX_ACHIEVABLE.values())
    row = transfer_row("cdna3")
    assert row is not None
    with replaced_family("cdna3", row):
        assert family_efficiency(mi325x) is row
    # a compute-bound prefill on the MI325X is faster than on the MI300X by about the factor
    spec = resolve_config("llama-3.1-8b")
    w = Workload(batch=8, input_len=2048, output_len=1)
    ratio = (CostModel(spec, mi300x, w).step_times("bf16").prefill_s
             / CostModel(spec, mi325x, w).step_times("bf16").prefill_s)
    assert 1.1 < ratio <= 843 / 708 + 1e-9


def test_fp8_gemms_run_at_their_measured_share_of_peak():
    """FP8 GEMMs reach a smaller share of their (2x) peak than BF16 on the same part: on the
    H100 SXM 70.9 vs 80.3 % (MAMF), on the MI325X 53.8 vs 63.6 % (AMD, normal inputs). A
    compute-bound FP8 GEMM is then 2 x that ratio faster than BF16, not 2x; memory-bound ones
    are untouched, and families without a measured pair keep eta_c."""
    from autoplan.cost.efficiency import all_math_shares, math_efficiency_factor
    from autoplan.cost.linear import gemm_time
    from autoplan.formats import Choice, Precision
    from autoplan.targets import load_references

    h100 = get_target("h100-sxm")
    hopper = (1402.6 / 1979) / (794.5 / 989)
    assert math_efficiency_factor(h100, "fp8") == pytest.approx(hopper)
    assert 0.88 < hopper < 0.89
    assert math_efficiency_factor(get_target("h200"), "fp8") == pytest.approx(hopper)
    assert math_efficiency_factor(get_target("mi300x"), "fp8") == pytest.approx(
        (1408.06 / 2614.9) / (831.40 / 1307.4))
    for name, dtype in (("h100-sxm", "bf16"), ("h100-sxm", "int8"), ("l40s", "fp8"),
                        ("b200", "fp8"), ("xeon-8480", "fp8")):
        assert math_efficiency_factor(get_target(name), dtype) == 1.0, (name, dtype)
    assert all(s.source in load_references() for s in all_math_shares().values())

    eff = family_efficiency(h100)
    big = {"m": 8192, "n": 8192, "k": 8192}
    bf16 = gemm_time(h100, eff, Choice.parse("bf16"), **big, baseline=Precision.BF16)
    fp8 = gemm_time(h100, eff, Choice.parse("fp8_e4m3"), **big, baseline=Precision.BF16)
    assert bf16.bound == fp8.bound == "compute"
    # the catalog's FP8 peak is 1,978.9 against 2 x 989.4 for BF16
    assert bf16.seconds / fp8.seconds == pytest.approx(2 * hopper, rel=1e-3)
    gemv = {"m": 1, "n": 8192, "k": 8192}  # memory-bound: half the weight bytes, as before
    ratio = (gemm_time(h100, eff, Choice.parse("bf16"), **gemv, baseline=Precision.BF16).seconds
             / gemm_time(h100, eff, Choice.parse("fp8_e4m3"), **gemv,
                         baseline=Precision.BF16).seconds)
    assert 1.9 < ratio < 2.0
