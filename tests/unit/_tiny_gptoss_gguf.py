"""Write a tiny gpt-oss as llama.cpp's convert_hf_to_gguf.py (GptOssModel) writes a released
gpt-oss checkpoint, with gguf-py only: the `gpt-oss` architecture's metadata (yarn RoPE keys,
`sliding_window`, `expert_feed_forward_length`), a byte-level BPE ("gpt2") vocabulary, and the
routed experts as the checkpoint's own MXFP4 bytes, repacked the way the converter does:
gate/up rows de-interleaved into `ffn_gate_exps` / `ffn_up_exps` (or, with `fused`, stacked
gate rows then up rows in one `ffn_gate_up_exps`), each 32-weight block as ggml's
`block_mxfp4` (E8M0 scale byte, then 16 bytes: element j in the low nibble of byte j, element
j + 16 in its high nibble), where the HF checkpoint packs elements 2j and 2j + 1 into byte j.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.unit._tiny_moe import mxfp4_pack


def ggml_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """HF MXFP4 (blocks [..., n, 16] low nibble = even element, scales [..., n]) -> ggml's
    block_mxfp4 bytes [..., n * 17]."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [..., n, 32]
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    raw = torch.cat([scales.unsqueeze(-1), qs.to(torch.uint8)], dim=-1)
    return np.ascontiguousarray(raw.flatten(-2).numpy())


_MERGES = ["h e", "l l"]


def gpt2_vocab(size: int) -> list[str]:
    """A byte-level BPE vocabulary of `size` (> 258) tokens: the 256 byte symbols, the two
    merged tokens of `_MERGES`, then specials."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    merged = [m.replace(" ", "") for m in _MERGES]
    return list(bytes_to_unicode().values()) + merged + [
        f"<|extra{i}|>" for i in range(size - 256 - len(merged))]


def write_gptoss_gguf(model: torch.nn.Module, path: Path, *, fused: bool = False,
                      mxfp4: bool = True, expert_count: int | None = None
                      ) -> dict[str, torch.Tensor]:
    """Write the gpt-oss `model` (transformers' stacked experts) to `path` as llama.cpp does.

    Returns the HF-layout MXFP4 tensors the released checkpoint would hold
    (`model.layers.N.mlp.experts.{gate_up,down}_proj_{blocks,scales}`) plus, under the
    plain `..._proj` keys, their dequantized values in transformers' [E, in, out] layout.
    `mxfp4=False`: the experts in F32, as the converter writes a float checkpoint (then only
    the plain keys). `expert_count` overrides the metadata's `gpt-oss.expert_count`.
    """
    import gguf

    cfg = model.config
    rope = cfg.rope_parameters
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_block_count(cfg.num_hidden_layers)  # TextModel.set_gguf_parameters' order
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(expert_count or cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_sliding_window(cfg.sliding_window)  # GptOssModel.set_gguf_parameters
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    vocab = gpt2_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(vocab)
    w.add_token_types([1] * 258 + [3] * (len(vocab) - 258))  # 3: control tokens
    w.add_token_merges(_MERGES)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, cfg.num_hidden_layers)
    q = gguf.GGMLQuantizationType
    hf: dict[str, torch.Tensor] = {}

    def put(name: str, value: torch.Tensor) -> None:
        kind = q.BF16 if value.ndim == 2 and "exps" not in name else q.F32
        w.add_tensor(name, gguf.quantize(np.ascontiguousarray(value.float().numpy()), kind),
                     raw_dtype=kind)

    for key, value in model.state_dict().items():
        value = value.detach()
        block = key.split(".")[2] if key.startswith("model.layers.") else None
        if ".mlp.experts." in key:
            proj = key.rsplit(".", 1)[1]
            if proj.endswith("_bias"):
                if proj == "down_proj_bias":
                    put(f"blk.{block}.ffn_down_exps.bias", value)
                elif fused:
                    put(f"blk.{block}.ffn_gate_up_exps.bias",
                        torch.cat([value[:, 0::2], value[:, 1::2]], dim=-1))
                else:
                    put(f"blk.{block}.ffn_gate_exps.bias", value[:, 0::2])
                    put(f"blk.{block}.ffn_up_exps.bias", value[:, 1::2])
                continue
            if not mxfp4:  # [E, out, in] floats, gate / up rows de-interleaved
                rows = value.transpose(1, 2)
                hf[key] = value
                parts_f = {"down": rows} if proj == "down_proj" else {
                    "gate": rows[:, 0::2], "up": rows[:, 1::2]}
                for part, v in parts_f.items():
                    put(f"blk.{block}.ffn_{part}_exps.weight", v.contiguous())
                continue
            blocks, scales, values = mxfp4_pack(value.transpose(1, 2))  # [E, out, in]
            hf[f"{key}_blocks"], hf[f"{key}_scales"] = blocks, scales
            hf[key] = values.transpose(1, 2)
            if proj == "down_proj":
                parts = {"down": (blocks, scales)}
            elif fused:
                parts = {"gate_up": (torch.cat([blocks[:, 0::2], blocks[:, 1::2]], 1),
                                     torch.cat([scales[:, 0::2], scales[:, 1::2]], 1))}
            else:
                parts = {"gate": (blocks[:, 0::2], scales[:, 0::2]),
                         "up": (blocks[:, 1::2], scales[:, 1::2])}
            for part, (b, s) in parts.items():
                w.add_tensor(f"blk.{block}.ffn_{part}_exps.weight", ggml_mxfp4(b, s),
                             raw_dtype=q.MXFP4)
            continue
        if key.endswith(".sinks"):  # the converter appends ".weight" to the sinks
            put(f"{names.get_name(key)}.weight", value)
            continue
        stem, _, suffix = key.rpartition(".")
        put(f"{names.get_name(stem)}.{suffix}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


__all__ = ["ggml_mxfp4", "gpt2_vocab", "write_gptoss_gguf"]
