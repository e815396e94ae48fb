"""Tiny random mixture-of-experts models of the four families autoplan plans, built in-process
from transformers' config classes (no downloads): hidden 64, 2 blocks, 4 query / 2 KV heads
of 16, 4 experts of width 32 (top-2), vocab 256; saved with transformers' own writer, which
stores the experts per expert as the released checkpoints do (Mixtral `block_sparse_moe.
experts.{e}.w1/w2/w3`, Qwen `mlp.experts.{e}.gate_proj` ...; gpt-oss stacked, in bf16).

- mixtral: top-2 of 4, renormalized;
- qwen2_moe: a shared expert of width 48 with its sigmoid gate, block 1 dense
  (`mlp_only_layers`), softmax weights not renormalized;
- qwen3_moe: q/k norms, renormalized top-2;
- gpt_oss: top-k-then-softmax router with a bias, biased experts with the clamped SwiGLU,
  gate/up interleaved in one tensor, sinks, block 0 windowed (4 tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.unit.tiny_llama import tiny_tokenizer

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
VOCAB = 256
EXPERTS, TOP_K = 4, 2
_COMMON = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
           "max_position_embeddings": 256, "initializer_range": 0.15, "eos_token_id": 1,
           "bos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": False}


def tiny_moe_config(family: str, **overrides):  # noqa: ANN201, ANN003 - a PretrainedConfig
    """The tiny config of `family`; `overrides` replace its fields (e.g. `rope_parameters`)."""
    import transformers as tf

    config = _tiny_moe_config(tf, family)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _tiny_moe_config(tf, family: str):  # noqa: ANN001, ANN202
    if family == "mixtral":
        return tf.MixtralConfig(**_COMMON, intermediate_size=32, num_local_experts=EXPERTS,
                                num_experts_per_tok=TOP_K)
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(**_COMMON, intermediate_size=96, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=48, num_experts=EXPERTS,
                                 num_experts_per_tok=TOP_K, mlp_only_layers=[1],
                                 norm_topk_prob=False, sliding_window=None)  # else 0 (refused)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(**_COMMON, intermediate_size=96, moe_intermediate_size=32,
                                 num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                                 norm_topk_prob=True)
    if family == "gpt_oss":
        return tf.GptOssConfig(**_COMMON, intermediate_size=32, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K, sliding_window=4,
                               layer_types=["sliding_attention", "full_attention"])
    raise ValueError(f"no tiny MoE model for '{family}'; have {', '.join(FAMILIES)}")


def tiny_moe_model(family: str, seed: int = 0, **overrides):  # noqa: ANN201, ANN003 - a CausalLM
    """The tiny MoE causal LM of `family`, fp32, eval mode, with transformers' fused experts."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_moe_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # routers and biases away from zero: routing depends on the input
        for name, param in model.named_parameters():
            if name.endswith(("gate.weight", "router.weight", "router.bias", "sinks")) \
                    or name.endswith("_bias"):
                param.normal_(0.0, 0.5)
    return model


_FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., rows, cols] -> (blocks uint8 [..., rows, cols/32, 16], scales uint8 [..., rows,
    cols/32], the dequantized values), the layout of gpt-oss's checkpoints: E2M1 codes (sign
    bit 3) two per byte, low nibble first, E8M0 scales (OCP floor rule)."""
    *lead, rows, cols = w.shape
    x = w.float().reshape(*lead, rows, cols // 32, 32)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(2.0**-120)
    exp = torch.floor(torch.log2(amax)) - 2
    y = x / 2.0**exp
    idx = (y.abs()[..., None] - _FP4).abs().argmin(-1)  # nearest magnitude (ties: the smaller)
    codes = idx + 8 * (y < 0).long()
    values = torch.where(y < 0, -_FP4[idx], _FP4[idx]) * 2.0**exp
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exp.squeeze(-1) + 127).to(torch.uint8), values.reshape(w.shape)


def save_tiny_moe(folder: Path, family: str, seed: int = 0) -> Path:
    """Write the tiny MoE of `family` (safetensors) and the character tokenizer to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_moe_model(family, seed).save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    return folder


__all__ = ["EXPERTS", "FAMILIES", "TOP_K", "VOCAB", "mxfp4_pack", "save_tiny_moe",
           "tiny_moe_config", "tiny_moe_model"]
