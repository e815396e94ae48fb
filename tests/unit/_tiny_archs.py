"""Tiny random Qwen3, Gemma 2, Gemma 3 and Phi-3 models, built in-process from transformers'
config classes (no downloads): hidden 64, 2 blocks, 4 query / 2 KV heads of 16, vocab 256.

Each exercises what sets its architecture apart, at sizes where it changes the output:
- qwen3: per-head RMSNorm of q and k (q_norm / k_norm) before the rotary embedding;
- gemma2: (1 + w) RMSNorms before and after attention and MLP, the embedding scaled by
  sqrt(hidden), a GELU-tanh MLP, attention scaled by query_pre_attn_scalar, attention-logit
  and final-logit soft-capping (caps small enough to bind on these logits), and a 4-token
  sliding window on block 0 (full attention on block 1);
- gemma3 (gemma3_text): q/k norms, block 0 local (4-token window, rope base 10 000) and
  block 1 global (rope base 1 000 000, linear rope scaling), as Gemma 3's 5:1 pattern does;
- phi3: q/k/v stored as one `qkv_proj` weight and gate/up as one `gate_up_proj`, and a
  sliding window on every block (Phi-3-mini-4k's config has one), partial rotary off.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.unit.tiny_llama import tiny_tokenizer

ARCHS = ("qwen3", "gemma2", "gemma3_text", "phi3")
VOCAB = 256
WINDOW = 4
INIT_STD = 0.15  # wide, like tests/unit/_tiny.py: compressing one layer moves the output

_COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": VOCAB, "max_position_embeddings": 256, "initializer_range": INIT_STD,
           "eos_token_id": 1, "bos_token_id": 1, "pad_token_id": 0}


def tiny_arch_config(arch: str):  # noqa: ANN201 - a transformers PretrainedConfig
    """The transformers config of the tiny model of `arch` (one of ARCHS)."""
    import transformers as tf

    if arch == "qwen3":
        return tf.Qwen3Config(**_COMMON, tie_word_embeddings=False)
    if arch == "gemma2":
        return tf.Gemma2Config(**_COMMON, query_pre_attn_scalar=24, sliding_window=WINDOW,
                               attn_logit_softcapping=1.5, final_logit_softcapping=2.0,
                               layer_types=["sliding_attention", "full_attention"])
    if arch == "gemma3_text":
        return tf.Gemma3TextConfig(
            **_COMMON, query_pre_attn_scalar=16, sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                             "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                "rope_theta": 1_000_000.0}})
    if arch == "phi3":
        common = {k: v for k, v in _COMMON.items() if k != "head_dim"}
        return tf.Phi3Config(**common, sliding_window=WINDOW, tie_word_embeddings=False)
    raise ValueError(f"no tiny model for '{arch}'; have {', '.join(ARCHS)}")


def tiny_arch_model(arch: str, seed: int = 0):  # noqa: ANN201 - a transformers CausalLM
    """The tiny causal LM of `arch` in eval mode, fp32, deterministic for a seed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_arch_config(arch), dtype=torch.float32).eval()
    with torch.no_grad():  # random norm weights: a norm that is skipped or misread shows
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
    return model


def save_tiny_arch(folder: Path, arch: str, seed: int = 0) -> Path:
    """Write the tiny model of `arch` (safetensors) and the character tokenizer into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_arch_model(arch, seed).save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    return folder


__all__ = ["ARCHS", "VOCAB", "WINDOW", "save_tiny_arch", "tiny_arch_config", "tiny_arch_model"]
