"""The numeric fields of a model's config.json that autoplan (or transformers, loading the
model) divides by or allocates from, each with its rule, checked before anything uses them.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoplan.errors import ModelConfigError

Config = Mapping[str, Any]


@dataclass(frozen=True)
class Field:
    """One numeric config.json field.

    Attributes:
        key: the config.json key.
        why: what autoplan or the loader does with it, for the message.
        integer: an integer field (else a finite float).
        minimum, maximum: inclusive bounds; maxima lie far beyond any published model, so a
            value past one is a typo (or a lie) that would otherwise allocate terabytes.
        exclusive_min: a float that must be strictly above `minimum`.
        required: absent (or null) is an error; optional fields may be absent or null.
    """

    key: str
    why: str
    integer: bool = True
    minimum: float = 1
    maximum: float = 2**20
    exclusive_min: bool = False
    required: bool = False

    def problem(self, value: Any) -> str | None:
        """Why `value` is not acceptable, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "an integer" if self.integer else "a number"
            return f"must be {kind}, got {value!r}"
        if self.integer and not (isinstance(value, int)
                                 or (math.isfinite(value) and float(value).is_integer())):
            return f"must be an integer, got {value!r}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        low = value <= self.minimum if self.exclusive_min else value < self.minimum
        if low or value > self.maximum:
            if self.integer:
                return (f"must be an integer from {int(self.minimum):,} to "
                        f"{int(self.maximum):,}, got {value!r}")
            lo = f"> {self.minimum:g}" if self.exclusive_min else f">= {self.minimum:g}"
            return f"must be a number {lo} and <= {self.maximum:g}, got {value!r}"
        return None


@dataclass(frozen=True)
class CrossRule:
    """A rule between fields: `check(config)` returns the message, or None when it holds
    (it runs only once every field of its set passed)."""

    name: str
    check: Callable[[Config], str | None]


@dataclass(frozen=True)
class FieldSet:
    """Fields that apply together, e.g. the dense decoder's or mixture-of-experts routing."""

    name: str
    fields: tuple[Field, ...]
    rules: tuple[CrossRule, ...] = ()
    applies: Callable[[Config], bool] = field(default=lambda cfg: True)


def _get(cfg: Config, key: str) -> Any:
    return cfg.get(key)


def _present(cfg: Config, *keys: str) -> bool:
    return any(cfg.get(k) is not None for k in keys)


def _heads(cfg: Config) -> str | None:
    heads, kv = int(cfg["num_attention_heads"]), cfg.get("num_key_value_heads")
    if kv is not None and heads % int(kv):
        return (f"num_attention_heads {heads} is not a multiple of num_key_value_heads "
                f"{int(kv)} (each KV head serves a whole group of query heads)")
    return None


def head_dim(cfg: Config) -> int:
    """The attention head size: `head_dim` when given, else hidden_size / heads."""
    given = cfg.get("head_dim")
    return int(given) if given is not None else int(cfg["hidden_size"]) // int(
        cfg["num_attention_heads"])


def _hidden_split(cfg: Config) -> str | None:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    if cfg.get("head_dim") is None and hidden % heads:
        return (f"hidden_size {hidden} is not divisible by num_attention_heads {heads}, and "
                "no head_dim is given: set head_dim, or fix one of the two")
    return None


def _rotary(cfg: Config) -> str | None:
    """RoPE rotates pairs of dimensions: the rotated part of a head must be whole pairs."""
    factor = cfg.get("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
    factor = 1.0 if factor is None else float(factor)
    dims = int(head_dim(cfg) * factor)
    if dims < 2 or dims % 2:
        return (f"the rotary dimension (head_dim {head_dim(cfg)} x {factor:g} = {dims}) must be "
                "an even number >= 2: rotary embeddings rotate pairs of dimensions")
    return None


def _padding(cfg: Config) -> str | None:
    """The embedding's padding row (transformers passes it to nn.Embedding)."""
    pad, vocab = cfg.get("pad_token_id"), int(cfg["vocab_size"])
    if pad is None:
        return None
    if isinstance(pad, bool) or not isinstance(pad, int) or not -vocab <= pad < vocab:
        return (f"pad_token_id must be a token id below vocab_size {vocab} (or null), got "
                f"{pad!r} (it names the embedding's padding row)")
    return None


_ROPE_THETA = Field("rope_theta", "the rotary base", integer=False, minimum=0, maximum=1e12,
                    exclusive_min=True)
_ROPE_FACTOR = Field("factor", "divides the rotary frequencies", integer=False, minimum=0,
                     maximum=1e6, exclusive_min=True)


def _rope_tables(cfg: Config) -> str | None:
    """`rope_parameters` / `rope_scaling` (one table, or one per attention type as in
    Gemma 3): their base and scaling factor."""
    for key in ("rope_parameters", "rope_scaling"):
        table = cfg.get(key)
        if not isinstance(table, Mapping):
            continue
        nested = [v for v in table.values() if isinstance(v, Mapping)]
        for part in nested or [table]:
            for f in (_ROPE_THETA, _ROPE_FACTOR):
                value = part.get(f.key)
                problem = None if value is None else f.problem(value)
                if problem:
                    return f"{key}.{f.key} {problem} ({f.why})"
    return None


DENSE = FieldSet("dense decoder", (
    Field("hidden_size", "the width of every layer", required=True),
    Field("num_hidden_layers", "the number of decoder blocks", maximum=10_000, required=True),
    Field("num_attention_heads", "divides hidden_size into heads", maximum=2**16,
          required=True),
    Field("num_key_value_heads", "divides the query heads into groups", maximum=2**16),
    Field("head_dim", "the size of each attention head", maximum=2**16),
    Field("intermediate_size", "the MLP's width", maximum=2**22, required=True),
    Field("vocab_size", "the embedding and lm_head rows", maximum=2**24, required=True),
    Field("max_position_embeddings", "the longest context (rotary tables, long-context "
          "checks)", maximum=2**24),
    _ROPE_THETA,
    Field("partial_rotary_factor", "the rotated share of each head", integer=False,
          minimum=0, maximum=1, exclusive_min=True),
    Field("rotary_pct", "the rotated share of each head", integer=False, minimum=0,
          maximum=1, exclusive_min=True),
    Field("rms_norm_eps", "the norm's epsilon", integer=False, minimum=0, maximum=1),
    Field("layer_norm_eps", "the norm's epsilon", integer=False, minimum=0, maximum=1),
    # 0 is no window: transformers 5 writes 0 for qwen2_moe whenever use_sliding_window is off
    Field("sliding_window", "the local attention window", minimum=0, maximum=2**24),
), (CrossRule("heads per KV head", _heads), CrossRule("hidden split into heads", _hidden_split),
    CrossRule("rotary pairs", _rotary), CrossRule("rotary tables", _rope_tables),
    CrossRule("padding row", _padding)))

SOFTCAPS = FieldSet("soft-caps and attention scale (Gemma 2/3)", (
    Field("final_logit_softcapping", "divides the logits (tanh(x / c) c)", integer=False,
          minimum=0, maximum=1e6, exclusive_min=True),
    Field("attn_logit_softcapping", "divides the attention scores", integer=False,
          minimum=0, maximum=1e6, exclusive_min=True),
    Field("query_pre_attn_scalar", "scales queries by its inverse square root",
          integer=False, minimum=0, maximum=2**20, exclusive_min=True),
), applies=lambda cfg: _present(cfg, "final_logit_softcapping", "attn_logit_softcapping",
                                "query_pre_attn_scalar"))

EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _experts(cfg: Config) -> int | None:
    for key in EXPERT_COUNT_KEYS:
        if cfg.get(key) is not None:
            return int(cfg[key])
    return None


def _routing(cfg: Config) -> str | None:
    experts = _experts(cfg)
    top_k = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
    if experts is not None and top_k is not None and int(top_k) > experts:
        return (f"num_experts_per_tok {int(top_k)} is more than the {experts} experts: each "
                "token is routed to at most every expert")
    return None


# Blocks x routed experts: one expert group each, three linear layers each in the spec.
# Kimi K2 (61 x 384 = 23,424) is the largest published; 2**18 is over ten times it.
MAX_EXPERT_GROUPS = 2**18


def _expert_groups(cfg: Config) -> str | None:
    experts, layers = _experts(cfg), cfg.get("num_hidden_layers")
    if experts is not None and isinstance(layers, int) and layers * experts > MAX_EXPERT_GROUPS:
        return (f"num_hidden_layers {layers:,} x {experts:,} routed experts is "
                f"{layers * experts:,} expert groups, more than {MAX_EXPERT_GROUPS:,} (over ten "
                "times the largest published model's): fix one of the two")
    return None


MOE = FieldSet("mixture-of-experts routing", tuple(
    Field(key, "the number of routed experts", maximum=2**16) for key in EXPERT_COUNT_KEYS)
    + (Field("num_experts_per_tok", "the experts each token is routed to", maximum=2**16),
       Field("experts_per_token", "the experts each token is routed to", maximum=2**16),
       Field("decoder_sparse_step", "divides the blocks into routed ones", maximum=10_000),
       Field("moe_intermediate_size", "each expert's MLP width", maximum=2**22),
       Field("shared_expert_intermediate_size", "the shared expert's MLP width",
             minimum=0, maximum=2**22),
       Field("n_shared_experts", "the number of shared experts", minimum=0, maximum=2**16)),
    (CrossRule("experts per token", _routing), CrossRule("expert groups", _expert_groups)),
    applies=lambda cfg: _present(cfg, *EXPERT_COUNT_KEYS, "num_experts_per_tok"))

_SETS: list[FieldSet] = [DENSE, SOFTCAPS, MOE]


def register_field_set(fields: FieldSet) -> FieldSet:
    """Add a set of fields (a new architecture's) to what `check_config` checks."""
    if any(s.name == fields.name for s in _SETS):
        raise ValueError(f"a field set named '{fields.name}' is already registered")
    _SETS.append(fields)
    return fields


def field_sets() -> tuple[FieldSet, ...]:
    """Every registered set, in the order they are checked."""
    return tuple(_SETS)


def numeric_fields() -> tuple[Field, ...]:
    """Every field of every registered set (for tests that try them all)."""
    return tuple(f for s in _SETS for f in s.fields)


def check_config(cfg: Config, source: str = "config.json") -> None:
    """Refuse the first field (or rule between fields) the config breaks.

    Args:
        cfg: the parsed config (a text model's own config, not a multimodal wrapper).
        source: how to name the config in the message (its path, or "config.json").

    Raises:
        ModelConfigError: one line naming the field, its rule and what it is used for.
    """
    for fields in _SETS:
        if not fields.applies(cfg):
            continue
        for f in fields.fields:
            value = _get(cfg, f.key)
            if value is None:
                if f.required:
                    raise ModelConfigError(f"{source} lacks required key '{f.key}' ({f.why})")
                continue
            problem = f.problem(value)
            if problem:
                raise ModelConfigError(f"{source}: {f.key} {problem} ({f.why})")
        for rule in fields.rules:
            problem = rule.check(cfg)
            if problem:
                raise ModelConfigError(f"{source}: {problem}")


__all__ = ["DENSE", "EXPERT_COUNT_KEYS", "MAX_EXPERT_GROUPS", "MOE", "SOFTCAPS", "CrossRule", "Field", "FieldSet",
           "check_config", "field_sets", "head_dim", "numeric_fields", "register_field_set"]
