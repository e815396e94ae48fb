"""Mixture-of-experts GGUFs: llama.cpp's stacked `ffn_*_exps` tensors [E, out, in] beside the
router `ffn_gate_inp`, read into (and named from) one nn.Linear per expert.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from autoplan.errors import AutoplanError, UserInputError

_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.([a-z_]+)$")


def stacked_stem(stem: str) -> tuple[str, int | None]:
    """(the merged HF name gguf-py maps, expert index) of a parameter's module name."""
    m = _PER_EXPERT.match(stem)
    return (f"{m.group(1)}.{m.group(3)}", int(m.group(2))) if m else (stem, None)


def gguf_fields(path: Path) -> dict[str, Any]:
    """GGUF metadata key -> value (header only)."""
    from autoplan.models.gguf_read import gguf_reader

    return {f.name: f.contents() for f in gguf_reader(path).fields.values()
            if not f.name.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                      "tokenizer.ggml.token_type"))}


def check_gguf_experts(path: Path) -> None:
    """Refuse an MoE GGUF whose stacked expert tensors (`*_exps`, experts on ggml's last
    dim) or router (`ffn_gate_inp`) hold another number of experts than its metadata's
    `{arch}.expert_count` says; header only, before any tensor is read.

    Raises:
        UserInputError: one line naming the tensor and both counts.
    """
    from autoplan.models.gguf_read import gguf_reader

    try:
        reader = gguf_reader(path)
    except (ValueError, OSError):  # not a readable GGUF: the loader says so
        return
    field = reader.fields.get("general.architecture")
    arch = field.contents() if field is not None else ""
    field = reader.fields.get(f"{arch}.expert_count")
    if field is None:
        return
    count = int(field.contents())
    for t in reader.tensors:
        dims = [int(d) for d in t.shape]
        if "_exps." in t.name or t.name.endswith("ffn_gate_inp.weight"):
            held = dims[-1]
        elif t.name.endswith("ffn_gate_inp.bias"):
            held = dims[0]
        else:
            continue
        if held != count:
            raise UserInputError(
                f"GGUF '{Path(path).name}': {t.name} holds {held} experts but its metadata "
                f"{arch}.expert_count says {count}; re-convert the model with llama.cpp's "
                "convert_hf_to_gguf.py")


# GGUF keys of the Qwen MoE expert widths that transformers' GGUF config mapping (5.x) does
# not carry over: without them the config keeps its class defaults (768, 5632).
_QWEN_MOE_WIDTHS = {"expert_feed_forward_length": "moe_intermediate_size",
                    "expert_shared_feed_forward_length": "shared_expert_intermediate_size"}


def moe_config(config: Any, path: Path) -> Any:
    """The config of an MoE GGUF: a llama GGUF with experts becomes a MixtralConfig (the
    router renormalizes its top-k weights, as llama.cpp's llama MoE does); a qwen2moe /
    qwen3moe GGUF gets its expert widths from the metadata; other configs are returned as
    they are."""
    if getattr(config, "model_type", "") in ("qwen2_moe", "qwen3_moe"):
        return _qwen_moe_widths(config, path)
    if getattr(config, "model_type", "") != "llama":
        return config
    try:
        fields = gguf_fields(path)
    except (ValueError, OSError):  # not a readable GGUF: the loader says so
        return config
    arch = fields.get("general.architecture", "")
    experts = int(fields.get(f"{arch}.expert_count") or 0)
    if arch != "llama" or experts <= 1:
        return config
    from transformers import MixtralConfig

    keep = {k: v for k, v in config.to_dict().items()
            if k not in ("model_type", "architectures", "transformers_version", "mlp_bias",
                         "pretraining_tp", "attention_bias")}
    moe = MixtralConfig(**keep, num_local_experts=experts,
                        num_experts_per_tok=int(fields.get(f"{arch}.expert_used_count") or 2))
    moe.architectures = ["MixtralForCausalLM"]
    return moe


def _qwen_moe_widths(config: Any, path: Path) -> Any:
    try:
        fields = gguf_fields(path)
    except (ValueError, OSError):  # not a readable GGUF: the loader says so
        return config
    arch = fields.get("general.architecture", "")
    for key, attr in _QWEN_MOE_WIDTHS.items():
        value = fields.get(f"{arch}.{key}")
        if value is not None and hasattr(config, attr):
            setattr(config, attr, int(value))
    return config


def _unpermute(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's per-head q/k row permutation (convert_hf_to_gguf.py `permute`)."""
    n = rows.shape[0]
    index = torch.arange(n).reshape(n_head, 2, n // n_head // 2).transpose(1, 2).reshape(n)
    out = torch.empty_like(rows)
    out[index] = rows
    return out


def moe_state(model: torch.nn.Module, names: dict[str, str], tensors: dict[str, Any],
              arch: str) -> dict[str, torch.Tensor]:
    """The unfused model's state dict from an MoE GGUF's dequantized tensors (`names`: HF
    parameter -> GGUF tensor; `tensors`: GGUF name -> (type, float32 tensor))."""
    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    state = {}
    for hf_name, gguf_name in names.items():
        if gguf_name not in tensors:
            continue
        value = tensors[gguf_name][1]
        _, expert = stacked_stem(hf_name.rpartition(".")[0])
        if expert is not None:
            value = value[expert]
        kind = gguf_name.split(".")[-2]
        if arch == "llama" and kind in heads:
            value = _unpermute(value, heads[kind])
        state[hf_name] = value.clone()
    missing = [k for k in model.state_dict() if k not in state and k != "lm_head.weight"]
    if missing:
        raise AutoplanError(f"the MoE GGUF holds no tensor for {missing[:3]}: it is not a "
                            "llama / qwen2moe / qwen3moe MoE layout autoplan reads")
    return state


def expert_value(stacked: torch.Tensor, hf_name: str) -> torch.Tensor:
    """The row of a stacked expert tensor a per-expert HF parameter holds (else the tensor)."""
    _, expert = stacked_stem(hf_name.rpartition(".")[0])
    return stacked if expert is None else stacked[expert]


__all__ = ["check_gguf_experts", "expert_value", "gguf_fields", "moe_config", "moe_state",
           "stacked_stem"]
