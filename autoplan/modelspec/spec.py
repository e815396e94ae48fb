"""ModelSpec / LayerGraph: a model's architecture from its HF config alone (no weights).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.config_fields import check_config
from autoplan.config_fields import head_dim as config_head_dim
from autoplan.errors import ModelConfigError
from autoplan.modelspec.mla import (MLA_TYPES, MLASpec, mla_from_config, mla_norm_params,
                                    mla_rows)
from autoplan.modelspec.moe import (MoESpec, is_moe_config, layer_windows, moe_block_rows,
                                    moe_from_config)

# model_type -> family. Families share a module layout.
_FAMILIES = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
    "gemma": "llama", "gemma2": "llama", "gemma3_text": "llama", "gpt_neox": "gpt_neox",
    "phi3": "phi3",
    "mixtral": "moe", "qwen2_moe": "moe", "qwen3_moe": "moe", "gpt_oss": "moe",
    **{t: "moe" for t in MLA_TYPES},  # costed from the config only: modelspec/mla.py
}
# RMSNorm weights per block beyond input/post-attention: Gemma 2/3's pre/post-feedforward
# norms (hidden each); q_norm / k_norm (head_dim each) in Qwen3 and Gemma 3.
_EXTRA_BLOCK_NORMS = {"gemma2": (2, 0), "gemma3_text": (2, 2), "qwen3": (0, 2),
                      "qwen3_moe": (0, 2)}

ROLES = ("q", "k", "v", "qkv", "o", "q_a", "q_b", "kv_a", "kv_b", "gate", "up", "gate_up",
         "down", "lm_head", "expert_gate", "expert_up", "expert_gate_up", "expert_down",
         "shared_gate", "shared_up", "shared_down")
# role -> the part of the model it belongs to (show and the report group decisions by it)
_PARTS = {"q": "attention", "k": "attention", "v": "attention", "qkv": "attention",
          "o": "attention", "q_a": "attention", "q_b": "attention", "kv_a": "attention",
          "kv_b": "attention", "gate": "mlp", "up": "mlp", "gate_up": "mlp", "down": "mlp",
          "lm_head": "lm_head", "expert_gate": "routed_experts", "expert_up": "routed_experts",
          "expert_gate_up": "routed_experts", "expert_down": "routed_experts",
          "shared_gate": "shared_expert", "shared_up": "shared_expert",
          "shared_down": "shared_expert"}


@dataclass(frozen=True)
class LinearLayer:
    """One linear layer: y = x @ W.T with W of shape [out_features, in_features]."""

    name: str
    role: str
    block: int  # transformer block index; -1 for lm_head
    in_features: int
    out_features: int
    fuse_group: str  # layers with the same group run as one GEMM in serving runtimes
    tensor: str = ""  # the stacked tensor an engine stores it in (routed experts); "" = its own
    expert: int = -1  # routed expert index; -1 for every other layer

    @property
    def params(self) -> int:
        return self.in_features * self.out_features

    @property
    def stored_as(self) -> str:
        """The tensor a runtime that does not fuse projections stores this layer in."""
        return self.tensor or self.name

    @property
    def part(self) -> str:
        """attention | mlp | shared_expert | routed_experts | lm_head."""
        return _PARTS[self.role]


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts the cost model and the search need."""

    model_type: str
    family: str
    hidden: int
    intermediate: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    gated_mlp: bool
    dtype: str
    layers: tuple[LinearLayer, ...] = field(repr=False)
    name: str = ""
    moe: MoESpec | None = None
    windows: tuple[int, ...] = ()  # per block: sliding window in tokens, 0 = full; () = all full
    sinks: bool = False  # a learned attention-sink logit per head (gpt-oss)
    mla: MLASpec | None = None  # multi-head latent attention (DeepSeek): costed, not loaded
    max_context: int = 0  # config.json's max_position_embeddings; 0: not given

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "",
                    source: str = "config.json") -> ModelSpec:
        """Build from a parsed HF config.json (`source` names it in messages).

        Raises:
            ModelConfigError: MoE or unknown types, or a field `config_fields` refuses.
        """
        if not isinstance(cfg, dict):
            raise ModelConfigError(f"{source} must hold a JSON object")
        model_type = str(cfg.get("model_type", "")).lower()
        if "text_config" in cfg and model_type not in _FAMILIES:
            return cls.from_config(cfg["text_config"], name, source)
        routed = is_moe_config(cfg, model_type)
        if routed and model_type not in _FAMILIES:
            moe_from_config(cfg, model_type)  # refuses it, naming what autoplan lacks for it
        if model_type not in _FAMILIES:
            raise ModelConfigError(
                f"unsupported model_type '{model_type or '(missing)'}' in config; supported: "
                f"{', '.join(sorted(_FAMILIES))}"
            )
        check_config(cfg, source)  # every size divided by or allocated from, one line each
        # after the bounds: it allocates per block (num_hidden_layers)
        moe = moe_from_config(cfg, model_type) if routed else None
        hidden = int(cfg["hidden_size"])
        n_layers = int(cfg["num_hidden_layers"])
        n_heads = int(cfg["num_attention_heads"])
        intermediate = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
        n_kv = int(cfg.get("num_key_value_heads") or n_heads)
        head_dim = config_head_dim(cfg)
        mla = mla_from_config(cfg) if model_type in MLA_TYPES else None
        if mla is not None:  # every head has its own query and key of qk_head_dim
            head_dim, n_kv = mla.qk_head_dim, n_heads
        family = _FAMILIES[model_type]
        # absent from config.json, transformers' own default for the type applies
        tie = bool(cfg.get("tie_word_embeddings", model_type in ("gemma", "gemma2", "gemma3_text")))
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        context = int(cfg.get("max_position_embeddings") or 0)
        if moe is not None:
            layers = _moe_layers(moe, n_layers, hidden, n_heads * head_dim, n_kv * head_dim,
                                 vocab)
            if mla is not None:
                layers = _with_mla(layers, mla, hidden, n_heads)
            return cls(model_type, family, hidden, intermediate, n_layers, n_heads, n_kv,
                       head_dim, vocab, tie, True, dtype, tuple(layers), name, moe,
                       layer_windows(cfg, model_type, n_layers), model_type == "gpt_oss",
                       mla, context)
        builder = {"llama": _llama_layers, "phi3": _phi3_layers, "gpt_neox": _neox_layers}[family]
        layers = builder(n_layers, hidden, intermediate, n_heads * head_dim, n_kv * head_dim, vocab)
        return cls(model_type, family, hidden, intermediate, n_layers, n_heads, n_kv, head_dim,
                   vocab, tie, family != "gpt_neox", dtype, tuple(layers), name,
                   None, layer_windows(cfg, model_type, n_layers), max_context=context)

    @classmethod
    def from_path(cls, path: str | Path) -> ModelSpec:
        """Read a config.json file, or the config.json inside an HF model folder."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ModelConfigError(f"no config.json at '{path}': pass an HF model folder or a "
                                   "config.json file")
        try:
            cfg = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelConfigError(f"{p} is not valid JSON: {exc}") from None
        return cls.from_config(cfg, name=p.parent.name if p.name == "config.json" else p.stem,
                               source=str(p))

    def require_weights_plannable(self) -> ModelSpec:
        """This spec, when autoplan can load its weights to measure, plan and export them.

        Raises:
            ModelConfigError: an architecture autoplan costs from its config only (MLA).
        """
        if self.mla is not None:
            raise ModelConfigError(
                f"'{self.model_type}' uses multi-head latent attention (MLA): autoplan predicts "
                "its cost from the config (estimate, fleet) but does not load MLA weights to "
                "profile, search or export them; plannable mixture-of-experts types: "
                "gpt_oss, mixtral, qwen2_moe, qwen3_moe")
        return self

    # ---- derived facts ---------------------------------------------------------------------
    def layer(self, name: str) -> LinearLayer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @property
    def linear_params(self) -> int:
        """Parameters in linear layers, lm_head included."""
        return sum(layer.params for layer in self.layers)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """Unique parameters (a tied lm_head shares the embedding matrix)."""
        wide, per_head = _EXTRA_BLOCK_NORMS.get(self.model_type, (0, 0))
        norms = (((2 + wide) * self.hidden + per_head * self.head_dim) * self.n_layers
                 + self.hidden)
        if self.mla is not None:
            norms += mla_norm_params(self.mla) * self.n_layers
        lm_head = self.vocab * self.hidden if not self.tie_embeddings else 0
        return (self.linear_params - self.vocab * self.hidden + lm_head + self.embedding_params
                + norms + self.unlisted_params)

    @property
    def unlisted_params(self) -> int:
        """Parameters outside the linear layers, embeddings and norms: MoE routers (and
        qwen2_moe's shared-expert gates), gpt-oss's expert and attention biases and sinks."""
        if self.moe is None:
            return 0
        attn = 0
        if self.sinks:  # gpt-oss: a sink per head, and biases on q/k/v/o
            attn = self.n_layers * (self.n_heads + (self.n_heads + 2 * self.n_kv_heads)
                                    * self.head_dim + self.hidden)
        return (self.moe.router_params(self.hidden) + self.moe.expert_bias_params(self.hidden)
                + attn)

    @property
    def active_intermediate(self) -> float:
        """MLP intermediate width one token passes through, averaged over blocks: the dense
        width, or top_k x the expert width (+ the shared expert's) in an MoE block."""
        moe = self.moe
        if moe is None:
            return float(self.intermediate)
        routed = moe.top_k * moe.expert_intermediate + moe.shared_intermediate
        dense = self.n_layers - len(moe.moe_blocks)
        return (routed * len(moe.moe_blocks) + moe.dense_intermediate * dense) / self.n_layers

    def active_params(self) -> float:
        """Parameters one token reads: all but the input embedding table (one row of it; a
        tied lm_head reads it whole), with every routed expert counted top_k / n_experts of
        its size (each token runs exactly top_k experts per block, whatever the routing
        frequencies). gpt-oss-20b / 120b: 3.6 / 5.1 B, OpenAI's figures."""
        embedding = 0 if self.tie_embeddings else self.embedding_params
        if self.moe is None:
            return float(self.total_params - embedding)
        routed = sum(layer.params for layer in self.layers if layer.expert >= 0)
        routed += self.moe.expert_bias_params(self.hidden)
        return self.total_params - embedding - routed * (1 - self.moe.top_k / self.moe.n_experts)

    @property
    def cached_width(self) -> int:
        """Elements one token leaves in one block's KV cache: K and V of every KV head, or
        MLA's latent and rotary key, one copy for all heads."""
        if self.mla is not None:
            return self.mla.cached_width
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def attention_widest(self) -> int:
        """Elements per token of the widest attention activation a prefill chunk holds:
        q, k and v of every head (MLA: the latent expanded to per-head keys and values)."""
        if self.mla is not None:
            return self.mla.prefill_qkv_width(self.n_heads)
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """KV-cache bytes per token of context: layers x `cached_width` x bytes."""
        return self.n_layers * self.cached_width * kv_bytes

    def window(self, block: int) -> int:
        """Block ``block``'s sliding attention window in tokens, 0 for full attention."""
        return self.windows[block] if self.windows else 0

    def kv_bytes_at(self, context: float, kv_bytes: float = 2.0) -> float:
        """KV-cache bytes of one sequence at `context` tokens: a sliding-window layer holds
        at most its window (vLLM's hybrid KV-cache manager frees what falls out of it)."""
        if not self.windows:
            return context * self.kv_bytes_per_token(kv_bytes)
        return self.kv_tokens(context) * self.cached_width * kv_bytes

    def context_problem(self, tokens: int) -> str:
        """Why a request of `tokens` tokens (prompt + output) is longer than this model
        serves, or "" when it is not (or the config gives no max_position_embeddings)."""
        if not self.max_context or tokens <= self.max_context:
            return ""
        return (f"a request of {tokens:,} tokens is longer than the model's context, "
                f"max_position_embeddings {self.max_context:,}: engines refuse it unless the "
                "context is extended (rope scaling in config.json)")

    def kv_tokens(self, context: float) -> float:
        """Cached tokens summed over layers at `context` (a windowed layer keeps its window)."""
        if not self.windows:
            return self.n_layers * context
        return sum(min(context, w) if w else context for w in self.windows)


def part_of(name: str) -> str:
    """The part of the model a layer name belongs to (attention | mlp | shared_expert |
    routed_experts | lm_head), from the name alone: plans carry names, not specs."""
    if ".experts." in name:
        return "routed_experts"
    if ".shared_expert." in name or ".shared_experts." in name:
        return "shared_expert"
    if "attn" in name or ".attention." in name:
        return "attention"
    if name in ("lm_head", "embed_out"):
        return "lm_head"
    return "mlp"


def _llama_layers(n_layers: int, hidden: int, inter: int, q_out: int, kv_out: int,
                  vocab: int) -> list[LinearLayer]:
    out: list[LinearLayer] = []
    for i in range(n_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        qkv, gate_up = f"model.layers.{i}.qkv", f"model.layers.{i}.gate_up"
        out += [
            LinearLayer(f"{attn}.q_proj", "q", i, hidden, q_out, qkv),
            LinearLayer(f"{attn}.k_proj", "k", i, hidden, kv_out, qkv),
            LinearLayer(f"{attn}.v_proj", "v", i, hidden, kv_out, qkv),
            LinearLayer(f"{attn}.o_proj", "o", i, q_out, hidden, f"{attn}.o_proj"),
            LinearLayer(f"{mlp}.gate_proj", "gate", i, hidden, inter, gate_up),
            LinearLayer(f"{mlp}.up_proj", "up", i, hidden, inter, gate_up),
            LinearLayer(f"{mlp}.down_proj", "down", i, inter, hidden, f"{mlp}.down_proj"),
        ]
    out.append(LinearLayer("lm_head", "lm_head", -1, hidden, vocab, "lm_head"))
    return out


def _moe_layers(moe: MoESpec, n_layers: int, hidden: int, q_out: int, kv_out: int,
                vocab: int) -> list[LinearLayer]:
    """Attention as Llama's; each MoE block's routed (and shared) experts, the other blocks'
    dense MLP; lm_head."""
    dense = _llama_layers(n_layers, hidden, moe.dense_intermediate, q_out, kv_out, vocab)
    moe_blocks = set(moe.moe_blocks)
    out: list[LinearLayer] = []
    for layer in dense[:-1]:
        if layer.block in moe_blocks and layer.role in ("gate", "up", "down"):
            if layer.role == "gate":
                out += [LinearLayer(r.name, r.role, layer.block, r.in_features, r.out_features,
                                    r.fuse_group, r.tensor, r.expert)
                        for r in moe_block_rows(moe, layer.block, hidden)]
            continue
        out.append(layer)
    out.append(dense[-1])
    return out


def _with_mla(layers: list[LinearLayer], mla: MLASpec, hidden: int, heads: int
              ) -> list[LinearLayer]:
    """Every block's q / k / v / o replaced by MLA's projections, in the same place."""
    out: list[LinearLayer] = []
    for layer in layers:
        if layer.role in ("k", "v", "o"):
            continue
        if layer.role == "q":
            out += [LinearLayer(name, role, layer.block, n_in, n_out, group)
                    for name, role, n_in, n_out, group in mla_rows(mla, layer.block, hidden,
                                                                   heads)]
            continue
        out.append(layer)
    return out


def _own_gemms(n_layers: int, rows, head: str, hidden: int,  # noqa: ANN001 - a callable
               vocab: int) -> list[LinearLayer]:
    """Layers of which each runs as its own GEMM (its own fuse group): `rows(i)` gives
    block i's (module path, role, in_features, out_features); `head` names the lm_head."""
    out = [LinearLayer(name, role, i, n_in, n_out, name)
           for i in range(n_layers) for name, role, n_in, n_out in rows(i)]
    out.append(LinearLayer(head, "lm_head", -1, hidden, vocab, head))
    return out


def _phi3_layers(n_layers: int, hidden: int, inter: int, q_out: int, kv_out: int,
                 vocab: int) -> list[LinearLayer]:
    """Phi-3: q/k/v in one `qkv_proj` weight [q | k | v], gate/up in one `gate_up_proj`
    weight [gate | up] (2 x intermediate outputs)."""
    def rows(i: int) -> list[tuple[str, str, int, int]]:
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        return [(f"{attn}.qkv_proj", "qkv", hidden, q_out + 2 * kv_out),
                (f"{attn}.o_proj", "o", q_out, hidden),
                (f"{mlp}.gate_up_proj", "gate_up", hidden, 2 * inter),
                (f"{mlp}.down_proj", "down", inter, hidden)]
    return _own_gemms(n_layers, rows, "lm_head", hidden, vocab)


def _neox_layers(n_layers: int, hidden: int, inter: int, q_out: int, kv_out: int,
                 vocab: int) -> list[LinearLayer]:
    def rows(i: int) -> list[tuple[str, str, int, int]]:
        attn, mlp = f"gpt_neox.layers.{i}.attention", f"gpt_neox.layers.{i}.mlp"
        return [(f"{attn}.query_key_value", "qkv", hidden, q_out + 2 * kv_out),
                (f"{attn}.dense", "o", q_out, hidden),
                (f"{mlp}.dense_h_to_4h", "up", hidden, inter),
                (f"{mlp}.dense_4h_to_h", "down", inter, hidden)]
    return _own_gemms(n_layers, rows, "embed_out", hidden, vocab)


__all__ = ["LinearLayer", "ModelSpec", "ROLES", "part_of"]
