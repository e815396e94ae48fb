"""Write a tiny transformers model as a GGUF the way llama.cpp's convert_hf_to_gguf.py does,
with gguf-py only (no llama.cpp needed): the architecture's metadata keys, a sentencepiece
("llama") vocabulary, Q8_0 / Q4_1 linears and F32 norms, and llama.cpp's storage quirks (q/k
rows permuted per head for Llama/Mistral/Mixtral, Gemma's RMSNorm weights stored as 1 + w);
an MoE model (its experts unfused) as llama.cpp's Mixtral: a "llama" GGUF with
`llama.expert_count`, each projection's experts stacked in one `ffn_*_exps` tensor, the
router (`ffn_gate_inp`) in F32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from autoplan.export.gguf import llama_permutation
from autoplan.models.gguf_convert import gguf_arch, hf_to_gguf_names
from autoplan.models.gguf_moe import stacked_stem

_PERMUTED = ("llama", "mistral", "mixtral")
_PLUS_ONE = ("gemma", "gemma2", "gemma3_text")


def write_tiny_gguf(model: torch.nn.Module, path: Path, vocab: list[str]) -> Path:
    """Write `model` (its config and weights) to `path`; returns the path.

    The GGUF holds the model's weights rounded to GGUF types, so the model itself is not
    what a conversion gives back: compare against ``gguf.dequantize`` of the file.
    """
    import gguf

    cfg = model.config
    arch = gguf.MODEL_ARCH_NAMES[gguf_arch(cfg.model_type)]
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    experts = getattr(cfg, "num_local_experts", 0) or getattr(cfg, "num_experts", 0)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "moe_intermediate_size", 0):  # qwen2moe / qwen3moe, as llama.cpp writes
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if getattr(cfg, "shared_expert_intermediate_size", 0):
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(vocab))
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):  # as llama.cpp writes
        if getattr(cfg, key, None):
            getattr(w, f"add_{key}")(getattr(cfg, key))
    rope = getattr(cfg, "rope_parameters", None) or {}
    scaled = rope.get("full_attention", rope)
    if scaled.get("rope_theta"):  # as llama.cpp's converter writes it (llama's default: 1e4)
        w.add_rope_freq_base(scaled["rope_theta"])
    if scaled.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaled["factor"])
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab)
    w.add_token_scores([-float(i) for i in range(len(vocab))])
    w.add_token_types([2 if i < 2 else 1 for i in range(len(vocab))])  # 2: control tokens
    w.add_bos_token_id(1)
    w.add_eos_token_id(1)
    w.add_unk_token_id(0)
    w.add_pad_token_id(0)
    names = hf_to_gguf_names(model, cfg.num_hidden_layers)
    q = gguf.GGMLQuantizationType
    tied = getattr(cfg, "tie_word_embeddings", False)
    stacks: dict[str, dict[int, torch.Tensor]] = {}  # ffn_*_exps -> expert -> weight
    for hf, tensor in model.state_dict().items():
        if hf not in names or (tied and hf == "lm_head.weight"):
            continue
        name = names[hf]
        value = tensor.detach().float()
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(
            name.split(".")[-2]) if cfg.model_type in _PERMUTED else None
        if heads and value.ndim == 2:
            value = value[llama_permutation(value.shape[0], heads)]
        if cfg.model_type in _PLUS_ONE and name.endswith("norm.weight"):
            value = value + 1
        expert = stacked_stem(hf.rpartition(".")[0])[1]
        if expert is not None:
            stacks.setdefault(name, {})[expert] = value
            continue
        kind = q.F32 if value.ndim == 1 or "ffn_gate_inp" in name or value.shape[-1] % 32 \
            else (q.Q8_0 if name == "token_embd.weight" else q.Q4_1)
        w.add_tensor(name, gguf.quantize(np.ascontiguousarray(value.numpy()), kind),
                     raw_dtype=kind)
    for name, experts in stacks.items():  # [E, out, in], expert order
        value = torch.stack([experts[e] for e in sorted(experts)])
        kind = q.F32 if value.shape[-1] % 32 else q.Q4_1  # GGUF blocks run along rows
        w.add_tensor(name, gguf.quantize(np.ascontiguousarray(value.numpy()), kind),
                     raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


__all__ = ["write_tiny_gguf"]
