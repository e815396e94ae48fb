"""gpt-oss GGUFs (llama.cpp's `gpt-oss` architecture) written back as gpt-oss's own HF
checkpoint: MXFP4 experts repacked byte for byte into `*_blocks` / `*_scales` (never
dequantized and re-quantized), so the HF-folder path loads them and records MXFP4.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autoplan.errors import AutoplanError, UserInputError
from autoplan.models.gguf_moe import expert_value, gguf_fields

ARCH = "gpt-oss"
_STACKED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")
# The released checkpoints' quantization_config: everything but the routed experts in floats.
_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                  "model.embed_tokens", "lm_head"]


def gptoss_config(path: Path) -> Any:
    """The GptOssConfig of a gpt-oss GGUF, from the keys llama.cpp's convert_hf_to_gguf.py
    writes; what a GGUF does not carry is gpt-oss's own (llama.cpp fixes it in code): even
    blocks windowed, odd blocks full; SwiGLU clamp 7.0; yarn without truncation.

    Raises:
        UserInputError: a RoPE scaling other than yarn.
    """
    from transformers import GptOssConfig

    from autoplan.models.gguf_read import gguf_reader

    fields = gguf_fields(path)
    tensors = {t.name: t for t in gguf_reader(path).tensors}

    def key(name: str, default: Any = None) -> Any:
        value = fields.get(f"{ARCH}.{name}", default)
        if isinstance(value, float):  # a float32 field: its shortest decimal (1e-05)
            return float(str(np.float32(value)))
        return value

    theta = float(key("rope.freq_base", 150000.0))
    scaling = key("rope.scaling.type", "none")
    if scaling == "yarn":
        original = int(key("rope.scaling.original_context_length"))
        rope = {"rope_type": "yarn", "rope_theta": theta, "truncate": False,
                "factor": float(key("rope.scaling.factor")),
                "original_max_position_embeddings": original,
                "beta_fast": float(key("rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(key("rope.scaling.yarn_beta_slow", 1.0))}
        if key("rope.scaling.yarn_attn_factor") is not None:
            rope["attention_factor"] = float(key("rope.scaling.yarn_attn_factor"))
    elif scaling == "none":
        rope = {"rope_type": "default", "rope_theta": theta}
    else:
        raise UserInputError(f"GGUF '{path.name}' sets '{scaling}' RoPE scaling; gpt-oss uses "
                             "yarn: re-convert it with llama.cpp's convert_hf_to_gguf.py")
    layers = int(key("block_count"))
    config = GptOssConfig(
        num_hidden_layers=layers, hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("expert_feed_forward_length") or key("feed_forward_length")),
        num_attention_heads=int(key("attention.head_count")),
        num_key_value_heads=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")),
        num_local_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        sliding_window=int(key("attention.sliding_window")),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        vocab_size=int(tensors["token_embd.weight"].shape[-1]),
        tie_word_embeddings="output.weight" not in tensors,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                     for i in range(layers)],  # llama.cpp: set_swa_pattern(2)
        rope_parameters=rope,
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=fields.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=fields.get("tokenizer.ggml.padding_token_id"))
    config.architectures = ["GptOssForCausalLM"]
    if _expert_types(tensors) == {"MXFP4"}:
        config.quantization_config = {"quant_method": "mxfp4",
                                      "modules_to_not_convert": _NOT_CONVERTED}
    return config


def _expert_types(tensors: dict[str, Any]) -> set[str]:
    return {t.tensor_type.name for n, t in tensors.items() if re.search(r"_exps\.weight$", n)}


def _gguf_name(key: str, names: Any) -> str:
    """The GGUF tensor of a non-expert parameter (the converter appends `.weight` to sinks)."""
    if key.endswith(".sinks"):
        return f"{names.get_name(key)}.weight"
    stem, _, suffix = key.rpartition(".")
    gguf_stem = names.get_name(stem)
    if gguf_stem is None:
        raise AutoplanError(f"no GGUF tensor name for {key} in gguf-py's gpt-oss map")
    return f"{gguf_stem}.{suffix}"


def _hf_mxfp4(t: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml block_mxfp4 bytes [E, rows, n * 17] -> the HF checkpoint's (blocks [E, rows, n,
    16], element 2j in the low nibble of byte j; scales [E, rows, n]): same codes and scales."""
    raw = torch.from_numpy(np.asarray(t.data, dtype=np.uint8).copy())
    raw = raw.reshape(*raw.shape[:-1], -1, 17)
    qs = raw[..., 1:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # element j, then j + 16
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous(), raw[..., 0].contiguous()


def gate_up_tensors(tensors: dict[str, Any], block: int | str, kind: str
                    ) -> tuple[Any, Any]:
    """(gate, up) GGUF tensors of a block's experts, as llama.cpp's converter splits
    gpt-oss's gate_up, or (fused gate-then-up tensor, None).

    Raises:
        KeyError: the block has neither.
    """
    fused = tensors.get(f"blk.{block}.ffn_gate_up_exps.{kind}")
    if fused is not None:
        return fused, None
    return tensors[f"blk.{block}.ffn_gate_exps.{kind}"], tensors[f"blk.{block}.ffn_up_exps.{kind}"]


def _interleave(gate: torch.Tensor, up: Any, dim: int) -> torch.Tensor:
    """gpt-oss's gate_up rows (gate row i at 2i, up row i at 2i + 1) from llama.cpp's split
    (or fused: all gate rows, then all up rows) along `dim`."""
    if up is None:
        gate, up = gate.chunk(2, dim=dim)
    return torch.stack([gate, up], dim=dim + 1).flatten(dim, dim + 1)


def _deq(t: Any) -> torch.Tensor:
    from gguf import dequantize

    return torch.from_numpy(dequantize(t.data, t.tensor_type).copy())


def gptoss_checkpoint(path: Path, config: Any) -> dict[str, torch.Tensor]:
    """The HF gpt-oss checkpoint's tensors (names, layouts) holding the GGUF's values: MXFP4
    experts as their own bytes, every other tensor dequantized to float32."""
    from gguf import MODEL_ARCH, get_tensor_name_map
    from transformers import AutoModelForCausalLM

    from autoplan.models.gguf_read import open_gguf

    # a reader of its own: a cached one would keep every tensor's pages mapped (gguf_read.py)
    tensors = {t.name: t for t in open_gguf(path).tensors}
    names = get_tensor_name_map(MODEL_ARCH.GPT_OSS, config.num_hidden_layers)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    mxfp4 = getattr(config, "quantization_config", None) is not None
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for key, param in skeleton.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        m = _STACKED.match(key)
        if m is None:
            gguf_name = _gguf_name(key, names)
            if gguf_name not in tensors:
                raise AutoplanError(f"the gpt-oss GGUF holds no tensor {gguf_name} for {key}")
            used.add(gguf_name)
            out[key] = _deq(tensors[gguf_name]).reshape(param.shape).float()
            continue
        block, proj, bias = m.groups()
        kind = "bias" if bias else "weight"
        pair = gate_up_tensors(tensors, block, kind) if proj == "gate_up_proj" else (
            tensors[f"blk.{block}.ffn_down_exps.{kind}"], None)
        used.update(t.name for t in pair if t is not None)
        if bias:  # [E, out]
            out[key] = (_interleave(_deq(pair[0]), None if pair[1] is None else _deq(pair[1]), 1)
                        if proj == "gate_up_proj" else _deq(pair[0])).float()
        elif mxfp4:  # [E, out, in / 32, 16] and [E, out, in / 32], bytes as they are
            parts = [_hf_mxfp4(t) for t in pair if t is not None]
            if proj == "gate_up_proj":
                gate = parts[0]
                up = parts[1] if len(parts) > 1 else (None, None)
                out[f"{key}_blocks"] = _interleave(gate[0], up[0], 1)
                out[f"{key}_scales"] = _interleave(gate[1], up[1], 1)
            else:
                out[f"{key}_blocks"], out[f"{key}_scales"] = parts[0]
        else:  # float experts: transformers' [E, in, out]
            rows = _interleave(_deq(pair[0]), None if pair[1] is None else _deq(pair[1]), 1) \
                if proj == "gate_up_proj" else _deq(pair[0])
            out[key] = rows.transpose(1, 2).contiguous().float()
    unused = sorted(set(tensors) - used)
    if unused:
        raise AutoplanError(f"gpt-oss GGUF tensors autoplan does not load: {unused[:3]}")
    return out


def verify_gptoss(model: torch.nn.Module, path: Path) -> int:
    """Check a loaded (experts unfused) gpt-oss against gguf-py's own dequantization of the
    GGUF: every parameter bit-equal to its tensor (an expert: its row of the stack, gate and
    up rows interleaved). Returns how many GGUF tensors were compared.

    Raises:
        AutoplanError: a parameter differs.
    """
    from gguf import MODEL_ARCH, get_tensor_name_map

    from autoplan.models.gguf_read import open_gguf

    # a reader of its own: a cached one would keep every tensor's pages mapped (gguf_read.py)
    tensors = {t.name: t for t in open_gguf(path).tensors}
    names = get_tensor_name_map(MODEL_ARCH.GPT_OSS, model.config.num_hidden_layers)
    cache: dict[str, torch.Tensor] = {}

    def ref(t: Any) -> torch.Tensor:
        if t.name not in cache:
            cache[t.name] = _deq(t).float()
        return cache[t.name]

    per_expert = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.\d+\.(gate_up_proj|down_proj)"
                            r"\.(weight|bias)$")
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        m = per_expert.match(key)
        if m is None:
            want = ref(tensors[_gguf_name(key, names)]).reshape(value.shape)
        else:
            block, proj, kind = m.groups()
            pair = gate_up_tensors(tensors, block, kind) if proj == "gate_up_proj" else (
                tensors[f"blk.{block}.ffn_down_exps.{kind}"], None)
            rows = [expert_value(ref(t), key) for t in pair if t is not None]
            want = _interleave(rows[0], rows[1] if len(rows) > 1 else None, 0) \
                if proj == "gate_up_proj" else rows[0]
        if not torch.equal(value.detach().float(), want):
            raise AutoplanError(f"converted tensor {key} differs from the gpt-oss GGUF")
    return len(cache)


def gptoss_tokenizer(path: Path) -> Any:
    """The GGUF's tokenizer (transformers' AutoTokenizer reads the file's config first, and its
    gpt-oss config reader fails on the rope keys; the tokenizer reader itself does not)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path.parent, gguf_file=path.name)


def convert_gptoss_into(tmp: Path, src: Path, config: Any) -> dict[str, int]:
    """Write the gpt-oss GGUF `src` into `tmp` as its HF checkpoint, load that back the way
    `load_model` does, verify every parameter against the GGUF and the file read-back.
    Returns counts for autoplan_source.json."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from autoplan.models.moe import source_quantization, unfuse_experts
    from autoplan.modelspec import ModelSpec

    state = gptoss_checkpoint(src, config)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(tmp)
    gptoss_tokenizer(src).save_pretrained(tmp)
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, use_safetensors=True,
                                                 **source_quantization(tmp))
    unfuse_experts(model, ModelSpec.from_config(config.to_dict()))
    compared = verify_gptoss(model, src)
    back = load_file(str(tmp / "model.safetensors"))
    if any(not torch.equal(back[k], v) for k, v in state.items()):
        raise AutoplanError("a gpt-oss tensor did not survive the safetensors round trip")
    return {"tensors": compared, "mxfp4_tensors": sum(k.endswith("_blocks") for k in state)}


__all__ = ["ARCH", "convert_gptoss_into", "gptoss_checkpoint", "gptoss_config",
           "gptoss_tokenizer", "verify_gptoss"]
