"""ModelSpec / LayerGraph: a model's architecture from its HF config alone (no weights).

Every linear layer is listed under its HF module path with its role (q, k, v, qkv, o, gate,
up, gate_up, down, lm_head), block index and shape, plus the groups a serving runtime fuses
(q/k/v into one GEMM, gate/up into one GEMM) so the search can make them share a choice. The
same names address the modules of a loaded transformers model.

A model that stores q/k/v or gate/up as one weight (Phi-3's `qkv_proj` and `gate_up_proj`)
lists that weight as one layer: it is one tensor, so it is one decision (one format, one
sparsity pattern). Every exporter keeps it whole: vLLM and compressed-tensors load Phi-3's
fused modules as they are, llama.cpp's GGUF stores them as `attn_qkv` and a double-width
`ffn_up`, and the ONNX export runs each as one MatMul node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.config_fields import EXPERT_COUNT_KEYS, check_config
from autoplan.config_fields import head_dim as config_head_dim
from autoplan.errors import ModelConfigError

# model_type -> family. Families share a module layout.
_FAMILIES = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
    "gemma": "llama", "gemma2": "llama", "gemma3_text": "llama", "gpt_neox": "gpt_neox",
    "phi3": "phi3",
}
# RMSNorm weights per block beyond input/post-attention: Gemma 2/3's pre/post-feedforward
# norms (hidden each); q_norm / k_norm (head_dim each) in Qwen3 and Gemma 3.
_EXTRA_BLOCK_NORMS = {"gemma2": (2, 0), "gemma3_text": (2, 2), "qwen3": (0, 2)}
_MOE_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx",
              "jamba", "olmoe", "phimoe", "gpt_oss", "llama4"}

ROLES = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down", "lm_head")


@dataclass(frozen=True)
class LinearLayer:
    """One linear layer: y = x @ W.T with W of shape [out_features, in_features]."""

    name: str
    role: str
    block: int  # transformer block index; -1 for lm_head
    in_features: int
    out_features: int
    fuse_group: str  # layers with the same group run as one GEMM in serving runtimes

    @property
    def params(self) -> int:
        return self.in_features * self.out_features


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
        if model_type not in _FAMILIES and model_type not in _MOE_TYPES:
            raise ModelConfigError(
                f"unsupported model_type '{model_type or '(missing)'}' in config; supported: "
                f"{', '.join(sorted(_FAMILIES))}"
            )
        experts = [cfg.get(k) for k in EXPERT_COUNT_KEYS]
        if model_type in _MOE_TYPES or any(isinstance(n, (int, float)) and n > 1
                                           for n in experts):
            raise ModelConfigError(
                f"'{model_type}' is a mixture-of-experts model; autoplan does not plan MoE models "
                "yet. Use a dense model (Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3, GPT-NeoX)"
            )
        check_config(cfg, source)  # every size divided by or allocated from, one line each
        hidden = int(cfg["hidden_size"])
        n_layers = int(cfg["num_hidden_layers"])
        n_heads = int(cfg["num_attention_heads"])
        intermediate = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
        n_kv = int(cfg.get("num_key_value_heads") or n_heads)
        head_dim = config_head_dim(cfg)
        family = _FAMILIES[model_type]
        # absent from config.json, transformers' own default for the type applies
        tie = bool(cfg.get("tie_word_embeddings", model_type in ("gemma", "gemma2", "gemma3_text")))
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        builder = {"llama": _llama_layers, "phi3": _phi3_layers, "gpt_neox": _neox_layers}[family]
        layers = builder(n_layers, hidden, intermediate, n_heads * head_dim, n_kv * head_dim, vocab)
        return cls(model_type, family, hidden, intermediate, n_layers, n_heads, n_kv, head_dim,
                   vocab, tie, family != "gpt_neox", dtype, tuple(layers), name)

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
        lm_head = self.vocab * self.hidden if not self.tie_embeddings else 0
        return self.linear_params - self.vocab * self.hidden + lm_head + self.embedding_params + norms

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """KV-cache bytes per token of context: 2 (K and V) x layers x kv heads x head_dim."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * kv_bytes


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


__all__ = ["LinearLayer", "ModelSpec", "ROLES"]
