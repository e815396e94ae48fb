"""Mixture-of-experts geometry from an HF config: experts, routing, shared experts, and the
attention facts the MoE families add (attention sinks), and every family's per-layer sliding
windows (layer_windows).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.errors import ModelConfigError
from autoplan.modelspec.mla import MLA_TYPES

SUPPORTED = ("gpt_oss", "mixtral", "qwen2_moe", "qwen3_moe")
# Routed-expert architectures autoplan neither plans nor costs, and what is missing for each
# (MLA_TYPES are costed, not planned: modelspec/mla.py).
_REFUSED = {
    "deepseek_v32": "DeepSeek Sparse Attention (a lightning indexer picks each query's keys)",
    "jamba": "hybrid Mamba state-space layers",
    "qwen3_next": "hybrid linear-attention (Gated DeltaNet) layers",
    "granitemoehybrid": "hybrid Mamba state-space layers",
    "nemotron_h": "hybrid Mamba state-space layers",
    "bailing_hybrid": "hybrid linear-attention layers",
}
# Any of these keys with more than one expert marks a config as MoE.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# Routing variants autoplan does not model: key -> the values it does.
_ROUTER_KEYS = {"scoring_func": ("softmax",), "topk_method": ("greedy",)}

# Expert projections as each family stores one expert: (suffix, role, in is hidden?)
_GATE_UP_DOWN = (("gate_proj", "expert_gate", True), ("up_proj", "expert_up", True),
                 ("down_proj", "expert_down", False))
_FUSED_GATE_UP = (("gate_up_proj", "expert_gate_up", True), ("down_proj", "expert_down", False))


@dataclass(frozen=True)
class MoESpec:
    """How a model routes its tokens.

    Attributes:
        n_experts: routed experts per MoE block.
        top_k: experts each token is sent to.
        expert_intermediate: one expert's intermediate width.
        shared_intermediate: the shared expert's intermediate width (0: none).
        moe_blocks: blocks whose MLP is routed; the others keep a dense MLP of
            `dense_intermediate`.
        dense_intermediate: the dense MLP width of the other blocks.
        router: "softmax_topk" (softmax over all experts, then the top k; renormalized over
            them when `norm_topk_prob`), "topk_softmax" (top k logits, softmax over them) or
            "sigmoid_topk" (DeepSeek-V3: sigmoid scores, the top k of the bias-corrected
            scores within the best expert groups; costed only).
        norm_topk_prob: the top-k weights are renormalized to sum to 1.
        router_bias: the router has a bias (gpt-oss).
        expert_bias: each expert projection has a bias (gpt-oss).
        shared_gate: a sigmoid gate scales the shared expert (qwen2_moe).
        fused_gate_up: one tensor per expert holds gate and up interleaved (gpt-oss).
        source_format: the format the checkpoint stores routed experts in ("" = its dtype;
            "mxfp4" for gpt-oss's quantization_config).
        shared_module: the shared expert's module under ``mlp`` (DeepSeek: shared_experts).
    """

    n_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int
    moe_blocks: tuple[int, ...]
    dense_intermediate: int
    router: str
    norm_topk_prob: bool
    router_bias: bool = False
    expert_bias: bool = False
    shared_gate: bool = False
    fused_gate_up: bool = False
    source_format: str = ""
    shared_module: str = "shared_expert"

    @property
    def projections(self) -> tuple[tuple[str, str, bool], ...]:
        """One expert's linear layers: (module suffix, role, reads the hidden state)."""
        return _FUSED_GATE_UP if self.fused_gate_up else _GATE_UP_DOWN

    def router_params(self, hidden: int) -> int:
        """Router (and shared-expert gate) parameters of all MoE blocks: kept at 16 bit."""
        per_block = self.n_experts * hidden + (self.n_experts if self.router_bias else 0)
        per_block += hidden if self.shared_gate else 0
        return per_block * len(self.moe_blocks)

    def expert_bias_params(self, hidden: int) -> int:
        """Bias parameters of all routed experts (gpt-oss: gate/up and down biases)."""
        if not self.expert_bias:
            return 0
        return self.n_experts * (2 * self.expert_intermediate + hidden) * len(self.moe_blocks)


def is_moe_config(cfg: dict[str, Any], model_type: str) -> bool:
    """Whether a config describes a model that routes tokens to experts."""
    return (model_type in SUPPORTED or model_type in MLA_TYPES or model_type in _REFUSED
            or any(_count(cfg.get(k)) > 1 for k in EXPERT_KEYS))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _positive(cfg: dict[str, Any], key: str, *fallbacks: str) -> int:
    for name in (key, *fallbacks):
        if name in cfg and cfg[name] is not None:
            value = cfg[name]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"config.json field '{name}' must be a positive integer, "
                                       f"got {value!r}")
            return value
    raise ModelConfigError(f"config.json lacks '{key}', which a {cfg.get('model_type')} "
                           "mixture-of-experts config needs")


def _check_router(cfg: dict[str, Any]) -> None:
    for key, known in _ROUTER_KEYS.items():
        value = cfg.get(key)
        if value is not None and value not in known:
            raise ModelConfigError(f"router {key} '{value}' is not supported (autoplan models "
                                   f"{', '.join(known)} routing)")
    for key in ("n_group", "topk_group"):
        if _count(cfg.get(key)) > 1:
            raise ModelConfigError(f"grouped expert routing ({key} = {cfg[key]}) is not "
                                   "supported; autoplan models plain top-k routing")
    scale = cfg.get("routed_scaling_factor")
    if scale not in (None, 1, 1.0):
        raise ModelConfigError(f"router routed_scaling_factor {scale} is not supported")


def moe_from_config(cfg: dict[str, Any], model_type: str) -> MoESpec:
    """The MoESpec of a supported MoE config.

    Raises:
        ModelConfigError: an MoE architecture autoplan does not plan (naming what is
            missing), a router it does not model, or a missing / non-positive field.
    """
    if not model_type:
        raise ModelConfigError(
            "config.json lacks 'model_type', which names the architecture: add the one "
            f"its checkpoint was made for, e.g. \"model_type\": \"qwen3_moe\" (supported "
            f"mixture-of-experts types: {', '.join(SUPPORTED)})")
    if model_type in _REFUSED:
        raise ModelConfigError(
            f"'{model_type}' uses {_REFUSED[model_type]}, which autoplan does not plan; "
            f"supported mixture-of-experts types: {', '.join(SUPPORTED)}")
    if model_type in MLA_TYPES:
        return _deepseek_moe(cfg)
    if model_type not in SUPPORTED:
        raise ModelConfigError(
            f"'{model_type}' is a mixture-of-experts model autoplan "
            f"does not plan; supported mixture-of-experts types: {', '.join(SUPPORTED)}")
    if cfg.get("kv_lora_rank"):
        raise ModelConfigError("multi-head latent attention (MLA, kv_lora_rank) is not "
                               "supported; autoplan plans MoE models with standard attention")
    _check_router(cfg)
    n_layers = _positive(cfg, "num_hidden_layers")
    hidden = _positive(cfg, "hidden_size")
    del hidden  # checked here; its value is the dense spec's
    if model_type in ("mixtral", "gpt_oss"):
        experts = _positive(cfg, "num_local_experts", "num_experts")
        inter = _positive(cfg, "intermediate_size")
        top_k = _positive(cfg, "num_experts_per_tok", "experts_per_token")
        blocks = tuple(range(n_layers))
        dense, shared = inter, 0
    else:  # qwen2_moe / qwen3_moe
        experts = _positive(cfg, "num_experts", "num_local_experts")  # transformers 5 renames it
        inter = _positive(cfg, "moe_intermediate_size")
        top_k = _positive(cfg, "num_experts_per_tok")
        dense = _positive(cfg, "intermediate_size")
        step = _count_field(cfg, "decoder_sparse_step", 1, lowest=1)  # null: transformers' 1
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(_count(i) or i == 0 for i in only):
            raise ModelConfigError("config.json field 'mlp_only_layers' must be a list of "
                                   f"block indices, got {only!r}")
        blocks = tuple(i for i in range(n_layers) if i not in only and (i + 1) % step == 0)
        if not blocks:
            raise ModelConfigError(
                f"config.json routes no block to experts (decoder_sparse_step {step}, "
                f"mlp_only_layers {only}, num_hidden_layers {n_layers}): fix one of the three")
        shared = 0
        if model_type == "qwen2_moe":
            if "shared_expert_intermediate_size" not in cfg:  # transformers would build 5,632
                raise ModelConfigError("config.json lacks 'shared_expert_intermediate_size', "
                                       "which a qwen2_moe mixture-of-experts config needs "
                                       "(0: no shared expert)")
            shared = cfg["shared_expert_intermediate_size"] or 0
            if not isinstance(shared, int) or shared < 0:
                raise ModelConfigError("config.json field 'shared_expert_intermediate_size' must "
                                       f"be a non-negative integer, got {shared!r}")
    if top_k > experts:
        raise ModelConfigError(f"config.json routes each token to {top_k} experts "
                               f"(num_experts_per_tok) but has only {experts}")
    gpt_oss = model_type == "gpt_oss"
    quant = cfg.get("quantization_config") or {}
    source = str(quant.get("quant_method", "")) if isinstance(quant, dict) else ""
    if source and source != "mxfp4":
        raise ModelConfigError(f"a '{source}' pre-quantized {model_type} checkpoint is not "
                               "supported; pass the unquantized model (gpt-oss: its mxfp4 "
                               "experts are read as they are)")
    default_norm = not model_type.startswith("qwen")  # transformers' defaults per type
    return MoESpec(
        n_experts=experts, top_k=top_k, expert_intermediate=inter,
        shared_intermediate=shared, moe_blocks=blocks, dense_intermediate=dense,
        router="topk_softmax" if gpt_oss else "softmax_topk",
        norm_topk_prob=True if model_type == "mixtral" else bool(
            cfg.get("norm_topk_prob", default_norm)),
        router_bias=gpt_oss, expert_bias=gpt_oss,
        shared_gate=model_type == "qwen2_moe" and shared > 0,
        fused_gate_up=gpt_oss, source_format=source)


def _count_field(cfg: dict[str, Any], key: str, default: int, *, lowest: int) -> int:
    """An integer field that may be absent (or null: its default), at least `lowest`."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= 2**16:
        raise ModelConfigError(f"config.json field '{key}' must be an integer from {lowest} "
                               f"to {2**16}, got {value!r}")
    return value


def _deepseek_moe(cfg: dict[str, Any]) -> MoESpec:
    """DeepSeek's layout: the first ``first_k_dense_replace`` blocks dense, then every
    ``moe_layer_freq``-th block routed, with ``n_shared_experts`` experts of the routed
    width always on. The router's variant (sigmoid scores, group-limited top-k, a scaling
    factor) changes no cost, so it is recorded, not refused: these models are costed only."""
    n_layers = _positive(cfg, "num_hidden_layers")
    experts = _positive(cfg, "n_routed_experts")
    inter = _positive(cfg, "moe_intermediate_size")
    top_k = _positive(cfg, "num_experts_per_tok")
    first = _count_field(cfg, "first_k_dense_replace", 0, lowest=0)
    step = _count_field(cfg, "moe_layer_freq", 1, lowest=1)  # DeepSeek takes i % it
    shared = _count_field(cfg, "n_shared_experts", 0, lowest=0)
    if top_k > experts:
        raise ModelConfigError(f"config.json routes each token to {top_k} experts "
                               f"(num_experts_per_tok) but has only {experts}")
    blocks = tuple(i for i in range(first, n_layers) if i % step == 0)
    if not blocks:
        raise ModelConfigError(
            f"config.json routes no block to experts (first_k_dense_replace {first}, "
            f"moe_layer_freq {step}, num_hidden_layers {n_layers}): fix one of the three")
    sigmoid = cfg.get("scoring_func") == "sigmoid"
    return MoESpec(
        n_experts=experts, top_k=top_k, expert_intermediate=inter,
        shared_intermediate=shared * inter,
        moe_blocks=blocks,
        dense_intermediate=_positive(cfg, "intermediate_size"),
        router="sigmoid_topk" if sigmoid else "softmax_topk",
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        router_bias=cfg.get("topk_method") == "noaux_tc",  # e_score_correction_bias
        shared_module="shared_experts")


_ATTENTION_TYPES = frozenset({"full_attention", "sliding_attention"})


def _max_window_layers(cfg: dict[str, Any]) -> int:
    value = cfg.get("max_window_layers")
    if value is None:
        return 28  # transformers' default for every Qwen config that reads it
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelConfigError(f"config.json field 'max_window_layers' must be an integer >= 0, "
                               f"got {value!r}")
    return value


def layer_windows(cfg: dict[str, Any], model_type: str, n_layers: int) -> tuple[int, ...]:
    """Per block, the sliding attention window in tokens (0: full attention), as
    transformers assigns layer types; empty when every layer attends fully.

    ``layer_types`` when the config lists them (gpt-oss alternates windowed and full layers
    when it does not); Gemma 2 alternates (even blocks sliding), Gemma 3 makes every
    ``sliding_window_pattern``-th block (default 6) global; a Qwen config slides only with
    ``use_sliding_window``: Qwen2/3 from ``max_window_layers`` (default 28) on, Qwen2-MoE in
    its even blocks below it, Qwen3-MoE in every block (transformers 5.25's rules); Gemma 1
    never does, and any other config with a ``sliding_window`` (Mistral v0.1, Mixtral,
    Phi-3) slides in every block."""
    types = cfg.get("layer_types")
    if types is not None and (not isinstance(types, list) or len(types) != n_layers):
        # transformers refuses the config too (PreTrainedConfig.validate_layer_type)
        raise ModelConfigError(f"config.json lists {len(types) if isinstance(types, list) else 0}"
                               f" layer_types for {n_layers} layers (num_hidden_layers): "
                               "list one per layer")
    unknown = sorted({str(t) for t in types} - _ATTENTION_TYPES) if types else []
    if unknown:  # a hybrid (linear attention, state-space layers) would cost as attention
        raise ModelConfigError(f"config.json layer_types {', '.join(unknown)} are not supported; "
                               f"autoplan plans layers of type {' and '.join(sorted(_ATTENTION_TYPES))}")
    window = cfg.get("sliding_window")
    if not window:
        return ()
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ModelConfigError(f"config.json field 'sliding_window' must be a positive integer, "
                               f"got {window!r}")
    if model_type.startswith("qwen") and not cfg.get("use_sliding_window"):
        return ()  # transformers drops a Qwen config's window unless use_sliding_window
    if model_type == "gpt_oss" and not types:
        types = (["sliding_attention", "full_attention"] * ((n_layers + 1) // 2))[:n_layers]
    if types:
        slides = [t == "sliding_attention" for t in types]
    elif model_type == "gemma":
        return ()
    elif model_type == "gemma2":
        slides = [i % 2 == 0 for i in range(n_layers)]
    elif model_type == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        slides = [(i + 1) % pattern != 0 for i in range(n_layers)]
    elif model_type == "qwen2_moe":
        below = _max_window_layers(cfg)
        slides = [i % 2 == 0 and i < below for i in range(n_layers)]
    elif model_type == "qwen3_moe":  # its config has no layer types: one window for all
        slides = [True] * n_layers
    elif model_type.startswith("qwen"):
        first = _max_window_layers(cfg)
        slides = [i >= first for i in range(n_layers)]
    else:
        slides = [True] * n_layers
    if not any(slides):
        return ()
    return tuple(window if s else 0 for s in slides)


@dataclass(frozen=True)
class ExpertRow:
    """One linear layer of a MoE block, before it becomes a modelspec LinearLayer."""

    name: str
    role: str
    in_features: int
    out_features: int
    fuse_group: str
    tensor: str  # the tensor a runtime that stores experts stacked holds it in
    expert: int  # routed expert index; -1 for the shared expert


def moe_block_rows(moe: MoESpec, block: int, hidden: int) -> list[ExpertRow]:
    """The routed and shared experts' linear layers of one MoE block.

    Every routed expert of a block is one fuse group (a fused-MoE kernel runs them all, and
    vLLM / TensorRT-LLM load one scheme per MoE layer); each projection's experts are one
    stacked tensor (llama.cpp's `ffn_gate_exps`, ...), the unit a runtime that stores them
    per tensor can give its own type.
    """
    mlp = f"model.layers.{block}.mlp"
    group = f"{mlp}.experts"
    rows = []
    for e in range(moe.n_experts):
        for suffix, role, reads_hidden in moe.projections:
            width = moe.expert_intermediate * (2 if role == "expert_gate_up" else 1)
            n_in, n_out = (hidden, width) if reads_hidden else (moe.expert_intermediate, hidden)
            rows.append(ExpertRow(f"{group}.{e}.{suffix}", role, n_in, n_out, group,
                                  f"{group}.{suffix}", e))
    if moe.shared_intermediate:
        shared, inter = f"{mlp}.{moe.shared_module}", moe.shared_intermediate
        rows += [
            ExpertRow(f"{shared}.gate_proj", "shared_gate", hidden, inter, f"{shared}.gate_up",
                      f"{shared}.gate_proj", -1),
            ExpertRow(f"{shared}.up_proj", "shared_up", hidden, inter, f"{shared}.gate_up",
                      f"{shared}.up_proj", -1),
            ExpertRow(f"{shared}.down_proj", "shared_down", inter, hidden, f"{shared}.down_proj",
                      f"{shared}.down_proj", -1),
        ]
    return rows


__all__ = ["EXPERT_KEYS", "SUPPORTED", "ExpertRow", "MoESpec", "is_moe_config",
           "layer_windows", "moe_block_rows", "moe_from_config"]
