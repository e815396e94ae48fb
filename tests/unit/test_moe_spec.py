"""Mixture-of-experts configs: the layer graph, routing facts and parameter counts."""

from __future__ import annotations

import pytest

from autoplan.cost import resolve_config
from autoplan.errors import ModelConfigError
from autoplan.modelspec import ModelSpec

_QWEN2_MOE = {
    "model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 128, "num_experts": 6, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
    "mlp_only_layers": [2],
}


@pytest.mark.parametrize(("name", "total", "active"), [
    ("mixtral-8x7b", 46.70e9, 12.75e9),  # "46.7B total, 12.9B active" (12.9 counts embeddings)
    ("qwen3-30b-a3b", 30.53e9, 3.04e9),  # "30.5B total, 3.3B activated" (ditto)
    ("gpt-oss-20b", 20.91e9, 3.61e9),  # OpenAI's model card: 20.91B total, 3.61B active
    ("gpt-oss-120b", 116.83e9, 5.13e9),  # 116.83B total, 5.13B active
])
def test_bundled_moe_configs_count_their_published_parameters(name, total, active) -> None:
    spec = resolve_config(name)
    assert spec.moe is not None
    assert spec.total_params == pytest.approx(total, rel=2e-3)
    assert spec.active_params() == pytest.approx(active, rel=5e-3)


def test_experts_are_per_expert_layers_in_one_group_per_block() -> None:
    spec = resolve_config("qwen3-30b-a3b")
    moe = spec.moe
    assert (moe.n_experts, moe.top_k, moe.expert_intermediate) == (128, 8, 768)
    block = [la for la in spec.layers if la.block == 5]
    experts = [la for la in block if la.expert >= 0]
    assert len(experts) == 128 * 3 and {la.fuse_group for la in experts} == {
        "model.layers.5.mlp.experts"}
    gate = next(la for la in experts if la.expert == 17 and la.role == "expert_gate")
    assert gate.name == "model.layers.5.mlp.experts.17.gate_proj"
    assert (gate.in_features, gate.out_features) == (2048, 768)
    assert gate.stored_as == "model.layers.5.mlp.experts.gate_proj" and gate.part == "routed_experts"
    assert {la.part for la in block if la.expert < 0} == {"attention"}
    # the router is no layer (no engine quantizes it) but counts in the parameters
    assert not any("mlp.gate" == la.name.rsplit(".", 1)[0][-8:] for la in spec.layers)
    assert spec.unlisted_params == 48 * 128 * 2048


def test_qwen2_moe_shared_expert_dense_blocks_and_sparse_step() -> None:
    spec = ModelSpec.from_config(_QWEN2_MOE)
    assert spec.moe.moe_blocks == (0, 1, 3)
    dense = [la for la in spec.layers if la.block == 2 and la.part == "mlp"]
    assert [la.name for la in dense] == [f"model.layers.2.mlp.{p}_proj"
                                         for p in ("gate", "up", "down")]
    assert dense[0].out_features == 96
    shared = [la for la in spec.layers if la.block == 0 and la.part == "shared_expert"]
    assert [(la.role, la.out_features) for la in shared] == [
        ("shared_gate", 48), ("shared_up", 48), ("shared_down", 64)]
    assert shared[0].fuse_group == shared[1].fuse_group != shared[2].fuse_group
    sparse = ModelSpec.from_config({**_QWEN2_MOE, "decoder_sparse_step": 2, "mlp_only_layers": []})
    assert sparse.moe.moe_blocks == (1, 3)
    # a null step is transformers' default, 1 (every block not in mlp_only_layers)
    assert ModelSpec.from_config({**_QWEN2_MOE, "decoder_sparse_step": None}).moe.moe_blocks \
        == spec.moe.moe_blocks
    # active: top_k of E routed experts, the shared expert whole
    routed = sum(la.params for la in spec.layers if la.expert >= 0)
    assert spec.active_params() == pytest.approx(
        spec.total_params - spec.embedding_params - routed * (1 - 2 / 6))
    assert spec.active_intermediate == pytest.approx((3 * (2 * 32 + 48) + 96) / 4)


def test_gpt_oss_windows_sinks_fused_gate_up_and_mxfp4_source() -> None:
    spec = resolve_config("gpt-oss-20b")
    assert spec.windows[:4] == (128, 0, 128, 0) and len(spec.windows) == 24 and spec.sinks
    assert spec.moe.source_format == "mxfp4" and spec.moe.router == "topk_softmax"
    one = [la for la in spec.layers if la.block == 0 and la.expert == 3]
    assert [(la.role, la.in_features, la.out_features) for la in one] == [
        ("expert_gate_up", 2880, 5760), ("expert_down", 2880, 2880)]
    # a windowed layer keeps at most its window of KV: 12 full layers + 12 x 128 tokens
    per_layer = 2 * 8 * 64 * 2
    assert spec.kv_bytes_at(4096) == per_layer * (12 * 4096 + 12 * 128)
    assert spec.kv_bytes_at(100) == 100 * spec.kv_bytes_per_token()
    dense = resolve_config("mixtral-8x7b")
    assert dense.windows == () and dense.kv_bytes_at(1000) == 1000 * dense.kv_bytes_per_token()


def test_causal_pairs_window_and_full() -> None:
    from autoplan.cost.fixed import _causal_pairs

    windows = resolve_config("gpt-oss-20b").windows
    assert sorted(set(windows)) == [0, 128]
    s = 1000
    pairs = sum(_causal_pairs(s, w) for w in windows)
    assert pairs == pytest.approx(12 * s * s / 2 + 12 * (128 * s - 128 ** 2 / 2))
    # a prompt shorter than the window attends causally to all of it: never negative
    assert sum(_causal_pairs(16, w) for w in windows) == 24 * 16 * 16 / 2


@pytest.mark.parametrize(("change", "needle"), [
    ({"num_experts_per_tok": 0}, "num_experts_per_tok must be an integer from 1 "),
    ({"num_experts": "8"}, "num_experts must be an integer, got '8'"),
    ({"mlp_only_layers": "all"}, "'mlp_only_layers' must be a list"),
    ({"shared_expert_intermediate_size": -1}, "shared_expert_intermediate_size must be an integer"),
    ({"topk_method": "noaux_tc"}, "router topk_method 'noaux_tc'"),
    ({"routed_scaling_factor": 2.5}, "routed_scaling_factor"),
    ({"quantization_config": {"quant_method": "fp8"}}, "pre-quantized"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be an integer from 1"),
    ({"decoder_sparse_step": 100}, r"routes no block to experts \(decoder_sparse_step 100"),
    ({"mlp_only_layers": [0, 1, 2, 3]}, "routes no block to experts"),
])
def test_bad_moe_fields_are_named(change, needle) -> None:
    with pytest.raises(ModelConfigError, match=needle):
        ModelSpec.from_config({**_QWEN2_MOE, **change})


def test_a_missing_shared_width_and_unknown_layer_types_are_named() -> None:
    """transformers would build a 5,632-wide shared expert where the width is missing, and
    a hybrid's linear-attention or state-space layers are no attention autoplan can cost."""
    no_shared = {k: v for k, v in _QWEN2_MOE.items() if k != "shared_expert_intermediate_size"}
    with pytest.raises(ModelConfigError, match="lacks 'shared_expert_intermediate_size'"):
        ModelSpec.from_config(no_shared)
    assert ModelSpec.from_config({**_QWEN2_MOE, "shared_expert_intermediate_size": 0}
                                 ).moe.shared_intermediate == 0
    with pytest.raises(ModelConfigError, match="layer_types linear_attention are not supported"):
        ModelSpec.from_config({**_QWEN2_MOE, "sliding_window": 64,
                               "layer_types": ["linear_attention", "full_attention"] * 2})
    dense = {k: v for k, v in _QWEN2_MOE.items() if "expert" not in k and "sparse" not in k
             and k != "mlp_only_layers"} | {"model_type": "qwen2"}
    assert ModelSpec.from_config(dense).moe is None
    with pytest.raises(ModelConfigError, match="layer_types mamba"):
        ModelSpec.from_config({**dense, "layer_types": ["mamba"] * 4})


def test_qwen_layer_types_follow_transformers() -> None:
    """One layer type per layer, whatever the window (transformers refuses other lengths);
    a Qwen config's window counts only with use_sliding_window, as transformers drops it."""
    for types in (["full_attention"] * 3, ["full_attention"] * 5, "full_attention"):
        with pytest.raises(ModelConfigError, match="layer_types for 4 layers"):
            ModelSpec.from_config({**_QWEN2_MOE, "layer_types": types})
    sliding = {**_QWEN2_MOE, "sliding_window": 16, "layer_types": ["sliding_attention"] * 4}
    assert ModelSpec.from_config({**sliding, "use_sliding_window": False}).windows == ()
    assert ModelSpec.from_config(sliding).windows == ()  # transformers' default: False
    assert ModelSpec.from_config({**sliding, "use_sliding_window": True}).windows == (16,) * 4
    ruled = {**_QWEN2_MOE, "sliding_window": 16, "use_sliding_window": True,
             "max_window_layers": 3}
    # transformers 5.25: Qwen2-MoE slides in its even blocks below max_window_layers,
    # Qwen3-MoE in every block, dense Qwen2/3 from max_window_layers on (default 28)
    assert ModelSpec.from_config(ruled).windows == (16, 0, 16, 0)
    assert ModelSpec.from_config({**ruled, "max_window_layers": 1}).windows == (16, 0, 0, 0)
    assert ModelSpec.from_config({**ruled, "model_type": "qwen3_moe"}).windows == (16,) * 4
    dense = {k: v for k, v in ruled.items() if "expert" not in k and "sparse" not in k
             and k != "mlp_only_layers"} | {"model_type": "qwen3"}
    assert ModelSpec.from_config(dense).windows == (0, 0, 0, 16)
    assert ModelSpec.from_config({**dense, "max_window_layers": None}).windows == ()
    with pytest.raises(ModelConfigError, match="max_window_layers"):
        ModelSpec.from_config({**dense, "max_window_layers": "2"})


def test_qwen_moe_renormalizes_top_k_only_when_asked() -> None:
    """transformers' Qwen2-MoE and Qwen3-MoE configs default norm_topk_prob to False."""
    for model_type in ("qwen2_moe", "qwen3_moe"):
        cfg = {**_QWEN2_MOE, "model_type": model_type}
        assert ModelSpec.from_config(cfg).moe.norm_topk_prob is False
        assert ModelSpec.from_config({**cfg, "norm_topk_prob": True}).moe.norm_topk_prob is True


def test_an_moe_config_without_model_type_says_so() -> None:
    untyped = {k: v for k, v in _QWEN2_MOE.items() if k != "model_type"}
    with pytest.raises(ModelConfigError, match="lacks 'model_type'.*\"model_type\": \"qwen3_moe\""):
        ModelSpec.from_config(untyped)
