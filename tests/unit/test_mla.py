"""Multi-head latent attention (DeepSeek-V2 / V3): costed from the config, refused for
anything that loads weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost import CostModel, resolve_config
from autoplan.errors import ModelConfigError
from autoplan.modelspec import ModelSpec
from autoplan.modelspec.mla import MLASpec
from autoplan.targets import get_target
from autoplan.workload import Workload

V3 = resolve_config("deepseek-v3")
LITE = resolve_config("deepseek-v2-lite")


def test_deepseek_v3_has_its_published_sizes() -> None:
    # DeepSeek-V3's model card: 671 B parameters in the main model, 37 B activated per token
    # (36.6 B counting the 0.9 B output head, README_WEIGHTS.md)
    assert V3.total_params == pytest.approx(671.0e9, rel=1e-3)
    assert V3.active_params() == pytest.approx(36.6e9, rel=2e-3)
    # the cache holds the 512-wide latent and the 64-wide rotary key per block: 70,272 B
    # per token in BF16 (2 x 128 heads x 192 x 61 x 2 B = 5.7 MiB without the compression)
    assert V3.kv_bytes_per_token(2.0) == 61 * (512 + 64) * 2
    assert V3.moe is not None and V3.moe.moe_blocks == tuple(range(3, 61))
    assert V3.moe.shared_intermediate == 2048 and V3.moe.n_experts == 256
    block3 = {la.name.rsplit(".", 1)[-1]: (la.in_features, la.out_features)
              for la in V3.layers if la.block == 3 and la.part == "attention"}
    assert block3 == {"q_a_proj": (7168, 1536), "q_b_proj": (1536, 128 * 192),
                      "kv_a_proj_with_mqa": (7168, 576), "kv_b_proj": (512, 128 * 256),
                      "o_proj": (128 * 128, 7168)}
    dense = [la for la in V3.layers if la.block == 0 and la.part == "mlp"]
    assert {la.out_features for la in dense if la.role == "gate"} == {18432}
    assert any(la.name == "model.layers.3.mlp.shared_experts.down_proj" for la in V3.layers)


def test_deepseek_v2_lite_projects_queries_directly() -> None:
    # DeepSeek-V2-Lite's model card: 15.7 B parameters, 2.4 B activated
    assert LITE.total_params == pytest.approx(15.7e9, rel=2e-3)
    assert LITE.active_params() == pytest.approx(2.4e9, rel=3e-2)
    roles = [la.role for la in LITE.layers if la.block == 1 and la.part == "attention"]
    assert roles == ["q", "kv_a", "kv_b", "o"]
    assert LITE.moe is not None and LITE.moe.moe_blocks == tuple(range(1, 27))
    assert LITE.moe.shared_intermediate == 2 * 1408


def test_every_moe_layer_freq_th_block_after_the_dense_ones_is_routed() -> None:
    cfg = json.loads((Path(__file__).parents[2]
                      / "autoplan/data/configs/deepseek-v2-lite.json").read_text())
    spec = ModelSpec.from_config({**cfg, "first_k_dense_replace": 3, "moe_layer_freq": 4})
    assert spec.moe is not None and spec.moe.moe_blocks == (4, 8, 12, 16, 20, 24)
    dense = {la.block for la in spec.layers if la.part == "mlp"}
    assert dense == set(range(27)) - set(spec.moe.moe_blocks)


def _with_mla(spec: ModelSpec, **change: int) -> ModelSpec:
    assert spec.mla is not None
    return dataclasses.replace(spec, mla=dataclasses.replace(spec.mla, **change))


def test_decode_attends_over_the_latent_and_prefill_per_head() -> None:
    # Long contexts at a large batch, so attention is a visible share of the step.
    t, wl = get_target("h200"), Workload(batch=64, input_len=8192, output_len=256)
    base = CostModel(LITE, t, wl).evaluate()
    # the cache read is batch x context x blocks x (latent + rotary key) x 2 B
    ctx = wl.mean_decode_context
    assert base.kv.read_bytes == pytest.approx(64 * ctx * 27 * 576 * 2, rel=1e-9)
    # absorbed decode never expands values per head: v_head_dim leaves decode attention
    # alone and changes prefill's
    wider_v = CostModel(_with_mla(LITE, v_head_dim=256), t, wl).evaluate()
    assert wider_v.fixed["attention"].decode_s == pytest.approx(base.fixed["attention"].decode_s)
    assert wider_v.fixed["attention"].prefill_s > base.fixed["attention"].prefill_s
    # a wider latent is read (and scored) by every decode step
    wider_latent = CostModel(_with_mla(LITE, kv_lora_rank=1024), t, wl).evaluate()
    assert wider_latent.kv.read_bytes == pytest.approx(base.kv.read_bytes * (1024 + 64) / 576)
    assert wider_latent.fixed["attention"].decode_s > base.fixed["attention"].decode_s


def test_mla_flops_per_key_and_pair() -> None:
    mla = MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128)
    assert mla.decode_flops_per_key(128) == 2 * 128 * (576 + 512)
    assert mla.prefill_flops_per_pair(128) == 2 * 128 * (192 + 128)


def test_estimate_counts_mla_cache_and_active_experts() -> None:
    out = CliRunner().invoke(cli, ["estimate", "--model", "deepseek-v2-lite", "--target",
                                   "h200", "--precision", "fp8", "--kv-cache", "fp8",
                                   "--batch", "64", "--input-len", "1000", "--output-len",
                                   "1000", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    est = data["candidate"]
    # an FP8 cache: 1 byte per cached element, 576 per token per block
    assert est["memory"]["kv_cache_bytes"] == pytest.approx(64 * 2000 * 27 * 576 * 1.0)
    # one token reads the active parameters (top-6 of 64 routed experts) at 1 byte each,
    # near the model card's 2.4 B, far below the 15.7 B the memory holds
    assert 2.3e9 < est["active_weight_bytes"] < 2.6e9 < 15e9 < est["memory"]["weights_bytes"]


def test_loading_mla_weights_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(json.loads(
        (Path(__file__).parents[2] / "autoplan/data/configs/deepseek-v3.json").read_text())))
    from autoplan.models.loader import load_spec

    with pytest.raises(ModelConfigError, match="multi-head latent attention.*estimate"):
        load_spec(str(cfg))
    out = CliRunner().invoke(cli, ["profile", "--model", str(cfg), "--dry-run",
                                   "--device", "cpu"])
    assert out.exit_code == 2
    assert "multi-head latent attention" in out.output and "Traceback" not in out.output


def test_an_mla_checkpoint_folder_is_refused_before_any_tensor_is_read(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from autoplan.models.loader import check_loadable, load_model, open_checkpoint

    (tmp_path / "config.json").write_text(
        (Path(__file__).parents[2] / "autoplan/data/configs/deepseek-v2-lite.json").read_text())
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)},
              str(tmp_path / "model.safetensors"))
    for load in (check_loadable, load_model, open_checkpoint):
        with pytest.raises(ModelConfigError, match="'deepseek_v2' uses multi-head latent"):
            load(str(tmp_path))
    out = CliRunner().invoke(cli, ["search", "--model", str(tmp_path), "--target", "h100"])
    assert out.exit_code == 2 and "multi-head latent attention" in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("change", "needle"), [
    ({"qk_rope_head_dim": None}, "lacks required key 'qk_rope_head_dim'"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim 63 must be even"),
    ({"kv_lora_rank": 0}, "kv_lora_rank must be an integer from 1 to 65,536, got 0"),
    ({"n_routed_experts": None}, "lacks 'n_routed_experts'"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok 300 is more than the 256 experts"),
    ({"kv_lora_rank": 10**12}, "kv_lora_rank must be an integer from 1 to 65,536"),
    ({"first_k_dense_replace": 61}, "routes no block to experts"),
    ({"moe_layer_freq": 100, "first_k_dense_replace": 3}, "routes no block to experts"),
    ({"moe_layer_freq": 0}, "'moe_layer_freq' must be an integer from 1"),
    ({"first_k_dense_replace": False}, "'first_k_dense_replace' must be an integer from 0"),
    ({"n_shared_experts": -1}, "n_shared_experts must be an integer from 0"),
])
def test_bad_mla_configs_name_the_field(change: dict, needle: str) -> None:
    cfg = json.loads((Path(__file__).parents[2]
                      / "autoplan/data/configs/deepseek-v3.json").read_text())
    cfg.update(change)
    with pytest.raises(ModelConfigError, match=needle):
        ModelSpec.from_config(cfg)
