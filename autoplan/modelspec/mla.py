"""Multi-head latent attention (MLA: DeepSeek-V2 / V3, Kimi K2) from an HF config: its
projections, what one token leaves in the KV cache, and the attention math serving engines
run on it in prefill and in decode.

autoplan costs MLA models (`estimate`, `--batch max`, the SLO modes, `fleet`) from their
config; it does not load their weights, so it neither measures nor plans them
(`require_weights_plannable`). Reasoning and sources: docs/moe.md, "MLA".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoplan.config_fields import CrossRule, Field, FieldSet, register_field_set

# model types whose attention is MLA, with DeepSeek's MoE layout (first_k_dense_replace,
# n_shared_experts, moe_layer_freq); Kimi K2 is DeepSeek-V3's architecture
MLA_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")


@dataclass(frozen=True)
class MLASpec:
    """One MLA block's attention geometry.

    Attributes:
        q_lora_rank: the compressed query width (q_a_proj's output); 0 when queries are
            projected from the hidden state directly (DeepSeek-V2-Lite).
        kv_lora_rank: the compressed key/value latent every head shares (cached).
        qk_nope_head_dim: the per-head query/key width without rotary embedding.
        qk_rope_head_dim: the rotary key width, one copy shared by every head (cached).
        v_head_dim: the per-head value width.
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached_width(self) -> int:
        """Elements one token leaves in one block's cache: the latent and the rotary key
        (576 for DeepSeek-V3, against 2 x 128 heads x 192 without the compression)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def decode_flops_per_key(self, heads: int) -> float:
        """FLOPs per cached token per query token in decode. Engines absorb kv_b_proj into
        the query and the output (vLLM's, SGLang's and TensorRT-LLM's MLA decode kernels,
        FlashMLA), so every head scores the 576-wide cached vector and sums the 512-wide
        latent: MQA over the latent. kv_b_proj's own FLOPs are its linear layer's."""
        return 2 * heads * (self.cached_width + self.kv_lora_rank)

    def prefill_flops_per_pair(self, heads: int) -> float:
        """FLOPs per causal (query, key) pair in prefill: engines expand the latent to
        per-head keys and values (kv_b_proj, its linear layer) and run ordinary attention
        with qk_head_dim-wide scores and v_head_dim-wide values."""
        return 2 * heads * (self.qk_head_dim + self.v_head_dim)

    def prefill_qkv_width(self, heads: int) -> int:
        """Elements per prompt token the prefill attention reads: per-head q, k and v."""
        return heads * (2 * self.qk_head_dim + self.v_head_dim)

    def rotary_width(self, heads: int) -> int:
        """Elements per token the rotary embedding rewrites: each head's rotary query part
        and the shared rotary key."""
        return (heads + 1) * self.qk_rope_head_dim


def _even_rotary(cfg: Mapping[str, Any]) -> str | None:
    rope = int(cfg["qk_rope_head_dim"])
    return (None if rope % 2 == 0 else f"qk_rope_head_dim {rope} must be even: rotary "
            "embeddings rotate pairs of dimensions")


def _width(key: str, why: str, required: bool = True) -> Field:
    return Field(key, why, maximum=2**16, required=required)  # as head_dim is bounded


# checked with every other config field (config_fields.check_config), before any is read
MLA_FIELDS = register_field_set(FieldSet("multi-head latent attention", (
    _width("q_lora_rank", "the compressed query width (null: no compression)", False),
    _width("kv_lora_rank", "the cached key/value latent's width"),
    _width("qk_nope_head_dim", "each head's query/key width without rotary embedding"),
    _width("qk_rope_head_dim", "the rotary key width every head shares"),
    _width("v_head_dim", "each head's value width"),
), (CrossRule("rotary pairs", _even_rotary),),
    applies=lambda cfg: str(cfg.get("model_type", "")).lower() in MLA_TYPES))


def mla_from_config(cfg: Mapping[str, Any]) -> MLASpec:
    """The MLASpec of an MLA config whose fields `MLA_FIELDS` has checked."""
    return MLASpec(q_lora_rank=int(cfg.get("q_lora_rank") or 0),
                   kv_lora_rank=int(cfg["kv_lora_rank"]),
                   qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
                   qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                   v_head_dim=int(cfg["v_head_dim"]))


def mla_rows(mla: MLASpec, block: int, hidden: int, heads: int
             ) -> list[tuple[str, str, int, int, str]]:
    """One block's attention projections as DeepSeek's checkpoints name them: (name, role,
    in_features, out_features, fuse group). q_a_proj and kv_a_proj_with_mqa read the same
    hidden state and run as one GEMM (vLLM's fused_qkv_a_proj)."""
    attn = f"model.layers.{block}.self_attn"
    fused = f"{attn}.fused_qkv_a_proj" if mla.q_lora_rank else f"{attn}.kv_a_proj_with_mqa"
    q_out = heads * mla.qk_head_dim
    if mla.q_lora_rank:
        rows = [(f"{attn}.q_a_proj", "q_a", hidden, mla.q_lora_rank, fused),
                (f"{attn}.q_b_proj", "q_b", mla.q_lora_rank, q_out, f"{attn}.q_b_proj")]
    else:
        rows = [(f"{attn}.q_proj", "q", hidden, q_out, f"{attn}.q_proj")]
    return rows + [
        (f"{attn}.kv_a_proj_with_mqa", "kv_a", hidden, mla.cached_width, fused),
        (f"{attn}.kv_b_proj", "kv_b", mla.kv_lora_rank,
         heads * (mla.qk_nope_head_dim + mla.v_head_dim), f"{attn}.kv_b_proj"),
        (f"{attn}.o_proj", "o", heads * mla.v_head_dim, hidden, f"{attn}.o_proj"),
    ]


def mla_norm_params(mla: MLASpec) -> int:
    """RMSNorm weights per block beyond input / post-attention: the latent's norm and the
    compressed query's."""
    return mla.kv_lora_rank + mla.q_lora_rank


__all__ = ["MLASpec", "MLA_FIELDS", "MLA_TYPES", "mla_from_config", "mla_norm_params",
           "mla_rows"]
