"""What autoplan's ONNX decoder needs to know about an architecture, read from the model.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from autoplan.errors import ModelConfigError

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                   "phi3")
_GEMMA = ("gemma", "gemma2", "gemma3_text")
# transformers activation class -> the ONNX formula written for it (onnx_graph._activation)
_ACTIVATIONS = {"SiLUActivation": "silu", "SiLU": "silu", "GELUTanh": "gelu_tanh",
                "PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh",
                "GELUActivation": "gelu"}
# config names of the same activations, for the config-only check
_ACT_NAMES = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
              "gelu_python_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu",
              "gelu_python": "gelu"}
# RoPE whose frequencies depend on every sequence seen before (transformers keeps the
# longest): a graph's inputs cannot carry that state.
_DYNAMIC_ROPE = ("dynamic",)


@dataclass(frozen=True)
class Rope:
    """One rotary table: frequencies, the cos/sin magnitude factor, and how many of the
    head's dimensions rotate (the rest pass through: partial rotary)."""

    inv_freq: np.ndarray  # [rotary_dim / 2] float32
    scale: float
    # longrope: the frequencies used when a call's largest position + 1 exceeds `switch_at`
    long_inv_freq: np.ndarray | None = None
    switch_at: int | None = None

    @property
    def dim(self) -> int:
        return 2 * int(self.inv_freq.shape[0])


@dataclass(frozen=True)
class Block:
    """Per-block attention facts."""

    window: int | None  # keys a query sees (itself included) with sliding-window attention
    rope: str  # key into Arch.ropes


@dataclass(frozen=True)
class Arch:
    """Everything the decoder graph varies on, for one loaded model."""

    model_type: str
    n_heads: int
    n_kv: int
    head_dim: int
    norm_offset: float  # 1.0: Gemma's RMSNorm scales by (1 + w)
    embed_scale: float | None  # Gemma multiplies the embedding by sqrt(hidden)
    activation: str  # silu | gelu_tanh | gelu
    attn_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    qk_norm: bool
    sandwich_norms: bool  # post-attention and pre/post-feedforward norms (Gemma 2/3)
    fused_qkv: bool  # one qkv_proj weight (Phi-3)
    fused_gate_up: bool  # one gate_up_proj weight (Phi-3)
    ropes: dict[str, Rope]
    blocks: tuple[Block, ...]


def _config_activation(cfg) -> str | None:  # noqa: ANN001 - an HF config
    return getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)


def _rope_types(cfg) -> list[str]:  # noqa: ANN001 - an HF config
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return []
    nested = [p for p in params.values() if isinstance(p, dict)]
    return [str(p.get("rope_type", p.get("type", "default"))) for p in (nested or [params])]


def check_supported(cfg) -> None:  # noqa: ANN001 - an HF config
    """Refuse, from the config alone, a model this export cannot build exactly.

    Raises:
        ModelConfigError: one line naming what is missing.
    """
    model_type = getattr(cfg, "model_type", "")
    if model_type not in SUPPORTED_TYPES:
        raise ModelConfigError(f"ONNX export supports model_type {', '.join(SUPPORTED_TYPES)}; "
                               f"got '{model_type}'")
    act = _config_activation(cfg)
    if act is not None and act not in _ACT_NAMES:
        raise ModelConfigError(f"ONNX export implements SiLU and GELU(-tanh) MLPs, not '{act}'")
    dynamic = [t for t in _rope_types(cfg) if t in _DYNAMIC_ROPE]
    if dynamic:
        raise ModelConfigError(
            f"ONNX export cannot follow '{dynamic[0]}' RoPE, whose frequencies depend on the "
            "longest sequence seen so far: plan this model for another runtime")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise ModelConfigError("ONNX export builds causal decoders; this config sets "
                               "use_bidirectional_attention (an embedding model)")


def _windows(cfg, n_layers: int) -> list[int | None]:  # noqa: ANN001 - an HF config
    """Per block, the sliding window transformers applies (its mask: key > query - window)."""
    window = getattr(cfg, "sliding_window", None) or None
    types = getattr(cfg, "layer_types", None)
    if types is None or getattr(cfg, "model_type", "") in ("mistral", "phi3"):
        # these apply config.sliding_window to every layer when it is set
        return [window] * n_layers
    return [window if t == "sliding_attention" else None for t in types[:n_layers]]


def _np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def _longrope(rotary: torch.nn.Module, cfg) -> tuple[np.ndarray, int]:  # noqa: ANN001
    """Longrope's long frequencies, computed as transformers computes them when it switches
    (its rope function at seq_len = original_max_position_embeddings + 1)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    switch = int(cfg.rope_parameters["original_max_position_embeddings"])
    long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=switch + 1)
    return _np32(long_inv), switch


def _ropes(rotary: torch.nn.Module, cfg, n_layers: int) -> tuple[dict[str, Rope], list[str]]:  # noqa: ANN001
    """Rotary tables and the one each block uses (Gemma 3: local and global)."""
    def read(prefix: str) -> Rope:
        # the *original* frequencies: longrope rewrites inv_freq in place on each forward
        inv = getattr(rotary, f"{prefix}original_inv_freq", None)
        if inv is None:
            inv = getattr(rotary, f"{prefix}inv_freq")
        scale = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        kind = getattr(rotary, "rope_type", None)
        kind = kind.get(prefix[:-1]) if isinstance(kind, dict) else kind
        if kind == "longrope":
            if prefix:
                raise ModelConfigError("ONNX export implements longrope for one rotary table, "
                                       "not per layer type")
            return Rope(_np32(inv), scale, *_longrope(rotary, cfg))
        return Rope(_np32(inv), scale)

    if getattr(rotary, "inv_freq", None) is not None:
        return {"default": read("")}, ["default"] * n_layers
    types = list(getattr(cfg, "layer_types", None) or [])[:n_layers]
    if len(types) != n_layers or not all(hasattr(rotary, f"{t}_inv_freq") for t in types):
        raise ModelConfigError(f"ONNX export cannot read the rotary tables of "
                               f"{type(rotary).__name__}")
    return {t: read(f"{t}_") for t in dict.fromkeys(types)}, types


def _activation(mlp: torch.nn.Module) -> str:
    fn = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    name = type(fn).__name__
    if name not in _ACTIVATIONS:
        raise ModelConfigError(f"ONNX export implements SiLU and GELU(-tanh) MLPs, not {name}")
    return _ACTIVATIONS[name]


def read_arch(model: torch.nn.Module) -> Arch:
    """The facts of a loaded transformers causal LM (refuses what cannot be exact).

    Raises:
        ModelConfigError: one line naming what is not supported.
    """
    cfg = model.config
    check_supported(cfg)
    inner = model.model
    n_layers = len(inner.layers)
    first = inner.layers[0]
    att = first.self_attn
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    ropes, rope_of = _ropes(inner.rotary_emb, cfg, n_layers)
    for rope in ropes.values():
        if rope.dim > head_dim or rope.dim % 2:
            raise ModelConfigError(f"rotary dimension {rope.dim} does not fit head_dim {head_dim}")
    embed_scale = getattr(inner.embed_tokens, "embed_scale", None)
    if embed_scale is not None:  # transformers casts it to the weight's dtype before the product
        embed_scale = float(embed_scale.to(inner.embed_tokens.weight.dtype))
    windows = _windows(cfg, n_layers)
    return Arch(
        model_type=cfg.model_type, n_heads=n_heads, n_kv=n_kv, head_dim=head_dim,
        norm_offset=1.0 if cfg.model_type in _GEMMA else 0.0,
        embed_scale=embed_scale, activation=_activation(first.mlp),
        attn_scale=float(getattr(att, "scaling", head_dim**-0.5)),
        attn_softcap=getattr(cfg, "attn_logit_softcapping", None) or None,
        final_softcap=getattr(cfg, "final_logit_softcapping", None) or None,
        qk_norm=hasattr(att, "q_norm") and hasattr(att, "k_norm"),
        sandwich_norms=hasattr(first, "pre_feedforward_layernorm"),
        fused_qkv=hasattr(att, "qkv_proj"), fused_gate_up=hasattr(first.mlp, "gate_up_proj"),
        ropes=ropes, blocks=tuple(Block(w, r) for w, r in zip(windows, rope_of, strict=True)))


def norm_eps(module: torch.nn.Module) -> float:
    """The epsilon an RMSNorm module adds (transformers names it two ways)."""
    eps = getattr(module, "variance_epsilon", None)
    return float(eps if eps is not None else module.eps)


__all__ = ["Arch", "Block", "Rope", "SUPPORTED_TYPES", "check_supported", "norm_eps",
           "read_arch"]
