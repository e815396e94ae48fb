"""The KV cache simulated where the engine stores it: inside attention, per layer.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from autoplan.errors import UserInputError
from autoplan.formats.kv import KvFormat, kv_spec

_PREFIX = "autoplan_kv|"
_HOOK = "_autoplan_kv_hook"


class KvHook(Protocol):
    def __call__(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(query, key, value) as the engine's attention sees them."""
        ...


def gguf_head_order(model_type: str, head_dim: int) -> Tensor | None:
    """The order llama.cpp holds q and k elements of a head in, as an index into
    transformers' order, or None when they agree.

    convert_hf_to_gguf.py permutes the q/k rows of Llama-family models per head
    (``LlamaModel.permute``: rotate-half pairs (i, i + d/2) become adjacent, for llama.cpp's
    interleaved RoPE), so a cache block of 32 along head_dim holds other elements than the
    same block in transformers' layout; NeoX-RoPE architectures (Qwen2/3, Gemma, Phi-3,
    GPT-NeoX) keep transformers' order.
    """
    if model_type not in ("llama", "mistral", "mixtral"):
        return None
    return torch.arange(head_dim).reshape(2, head_dim // 2).t().reshape(head_dim)


def _in_order(x: Tensor, order: Tensor | None, fn) -> Tensor:  # noqa: ANN001 - a rounding
    """``fn`` applied to x's last dim in ``order`` (then put back in x's order)."""
    if order is None:
        return fn(x)
    return fn(x[..., order])[..., torch.argsort(order)]


@dataclass(frozen=True)
class KvQuant:
    """One layer's cache format, its static K/V scales ([1], or [kv_heads] per head; None
    for formats without calibrated scales), the engine's query rounding (None: none) and,
    for block formats, the order the engine holds K and q elements in (``gguf_head_order``;
    None: transformers')."""

    fmt: KvFormat
    k_scale: Tensor | None = None
    v_scale: Tensor | None = None
    query: KvFormat | None = None
    order: Tensor | None = None

    def __call__(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        spec = kv_spec(self.fmt)
        key = _in_order(key, self.order, lambda x: spec.quantize(x, self.k_scale))
        value = spec.quantize(value, self.v_scale)
        if self.query is not None:  # unit scale: vLLM's q_scale default, ggml's own blocks
            qspec = kv_spec(self.query)
            one = torch.ones(1) if qspec.static else None
            query = _in_order(query, self.order, lambda x: qspec.quantize(x, one))
        return query, key, value


@dataclass
class KvAmax:
    """The largest |K| and |V| a layer's attention saw, per tensor and per KV head."""

    k_head: Tensor | None = None  # [kv_heads]
    v_head: Tensor | None = None

    def __call__(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        k = key.detach().abs().float().amax(dim=(0, 2, 3))
        v = value.detach().abs().float().amax(dim=(0, 2, 3))
        self.k_head = k if self.k_head is None else torch.maximum(self.k_head, k)
        self.v_head = v if self.v_head is None else torch.maximum(self.v_head, v)
        return query, key, value

    def scales(self, fmt: KvFormat) -> tuple[Tensor | None, Tensor | None]:
        """The static K and V scales ``fmt`` stores (None, None for formats without)."""
        spec = kv_spec(fmt)
        if not spec.static:
            return None, None
        if self.k_head is None or self.v_head is None:
            raise UserInputError("the KV scales were not calibrated: no calibration batch "
                                 "reached this layer's attention")
        if spec.granularity == "head":
            return spec.calibrate(self.k_head), spec.calibrate(self.v_head)
        return (spec.calibrate(self.k_head.amax().reshape(1)),
                spec.calibrate(self.v_head.amax().reshape(1)))


def attention_modules(model: nn.Module) -> dict[int, nn.Module]:
    """Each decoder block's attention module, by its ``layer_idx``."""
    found: dict[int, nn.Module] = {}
    for name, module in model.named_modules():
        idx = getattr(module, "layer_idx", None)
        if isinstance(idx, int) and name.rsplit(".", 1)[-1] in ("self_attn", "attention") \
                and hasattr(module, "config"):
            found[idx] = module
    return found


def _base_function(module: nn.Module, base: str) -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base == "eager":  # each model file defines its own (Gemma 2's soft-caps)
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _wrapped(base: str):  # noqa: ANN202 - an attention function
    def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, **kwargs: Any) -> Any:
        hook = getattr(module, _HOOK, None)
        if hook is not None:
            query, key, value = hook(query, key, value)
        return _base_function(module, base)(module, query, key, value, attention_mask, **kwargs)

    return attention


def _registered(base: str) -> str:
    """The wrapper's implementation name for ``base``, registered with its mask function."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    name = _PREFIX + base
    if name not in ALL_ATTENTION_FUNCTIONS:
        if base != "eager" and base not in ALL_ATTENTION_FUNCTIONS:
            raise UserInputError(f"the KV-cache simulation cannot wrap attention '{base}'; "
                                 "load the model with attn_implementation='sdpa' or 'eager'")
        AttentionInterface.register(name, _wrapped(base))
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


@dataclass
class _Installed:
    configs: list[tuple[Any, str]] = field(default_factory=list)
    modules: list[nn.Module] = field(default_factory=list)


def _configs(modules: Iterable[nn.Module]) -> list[Any]:
    seen: dict[int, Any] = {}
    for m in modules:
        seen.setdefault(id(m.config), m.config)
    return list(seen.values())


def attach_kv(model: nn.Module, hooks: Mapping[int, KvHook]) -> _Installed:
    """Give block i's attention ``hooks[i]`` until ``detach_kv`` (a compressed copy that is
    measured and dropped keeps them for good).

    Raises:
        UserInputError: a hook names a block the model does not have, or the model's
            attention implementation cannot be wrapped.
    """
    attn = attention_modules(model)
    missing = sorted(set(hooks) - set(attn))
    if missing:
        raise UserInputError(f"no attention module for blocks {missing[:4]} (the model has "
                             f"{len(attn)})")
    state = _Installed()
    try:
        for config in _configs(attn.values()):
            base = config._attn_implementation or "eager"
            if not base.startswith(_PREFIX):
                state.configs.append((config, base))
                config._attn_implementation = _registered(base)
        for i, hook in hooks.items():
            setattr(attn[i], _HOOK, hook)
            state.modules.append(attn[i])
    except BaseException:
        detach_kv(state)
        raise
    return state


def detach_kv(state: _Installed) -> None:
    """Undo ``attach_kv``: the hooks removed, each config's attention implementation back."""
    for m in state.modules:
        if hasattr(m, _HOOK):
            delattr(m, _HOOK)
    for config, base in state.configs:
        config._attn_implementation = base


@contextmanager
def kv_hooks(model: nn.Module, hooks: Mapping[int, KvHook]) -> Iterator[None]:
    """Within the block, block i's attention hands (q, k, v) to ``hooks[i]`` first."""
    state = attach_kv(model, hooks)
    try:
        yield
    finally:
        detach_kv(state)


@torch.no_grad()
def calibrate_kv(model: nn.Module, batches: Iterable[Tensor]) -> dict[int, KvAmax]:
    """The largest |K| and |V| each block's attention sees on ``batches`` (token ids)."""
    amax = {i: KvAmax() for i in attention_modules(model)}
    device = next(model.parameters()).device
    with kv_hooks(model, amax):
        for batch in batches:
            model(input_ids=batch.to(device), use_cache=False)
    return amax


def kv_quants(fmts: Mapping[int, KvFormat], amax: Mapping[int, KvAmax] | None,
              query: KvFormat | None, order: Tensor | None = None) -> dict[int, KvQuant]:
    """Each block's KvQuant from its format and calibrated amax (formats with static scales
    need ``amax``); ``order``: the engine's element order of K and q (block formats)."""
    out = {}
    for i, fmt in fmts.items():
        if kv_spec(fmt).static and (amax is None or i not in amax):
            raise UserInputError(f"the {fmt.value} KV cache needs calibrated scales for block "
                                 f"{i}; calibrate them first (calibrate_kv)")
        k, v = amax[i].scales(fmt) if kv_spec(fmt).static else (None, None)  # type: ignore[index]
        out[i] = KvQuant(fmt, k, v, query, order if kv_spec(fmt).block else None)
    return out


__all__ = ["KvAmax", "KvHook", "KvQuant", "attach_kv", "gguf_head_order", "attention_modules", "calibrate_kv",
           "detach_kv", "kv_hooks", "kv_quants"]
