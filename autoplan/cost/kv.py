"""KV-cache terms of the cost model: what a cache format stores per token, per block.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoplan.errors import UserInputError
from autoplan.formats.kv import KvFormat, kv_spec
from autoplan.modelspec import ModelSpec

KvInput = KvFormat | str | Mapping[int, KvFormat | str] | Sequence[KvFormat | str]


@dataclass(frozen=True)
class KvLayout:
    """Stored bytes per cached element of each block, and the format behind each (None when
    only the byte count was given, e.g. a validation point's ``kv_bytes``)."""

    element_bytes: tuple[float, ...]
    formats: tuple[KvFormat | None, ...]

    @classmethod
    def uniform_bytes(cls, spec: ModelSpec, kv_bytes: float) -> KvLayout:
        if not kv_bytes > 0:
            raise UserInputError(f"KV bytes per element must be > 0, got {kv_bytes}")
        return cls((float(kv_bytes),) * spec.n_layers, (None,) * spec.n_layers)

    @classmethod
    def of(cls, spec: ModelSpec, kv: KvInput) -> KvLayout:
        """One format for every block (a KvFormat or its name), or one per block (a mapping
        block -> format, every block present, or a sequence in block order)."""
        if isinstance(kv, (KvFormat, str)):
            fmts = [KvFormat.parse(kv) if isinstance(kv, str) else kv] * spec.n_layers
        elif isinstance(kv, Mapping):
            missing = sorted(set(range(spec.n_layers)) - set(kv))
            if missing or len(kv) != spec.n_layers:
                raise UserInputError(f"a per-block KV layout needs blocks 0..{spec.n_layers - 1}"
                                     f" exactly (missing {missing[:4]})")
            fmts = [KvFormat.parse(kv[i]) if isinstance(kv[i], str) else kv[i]  # type: ignore[arg-type]
                    for i in range(spec.n_layers)]
        else:
            fmts = [KvFormat.parse(k) if isinstance(k, str) else k for k in kv]
            if len(fmts) != spec.n_layers:
                raise UserInputError(f"a per-block KV layout needs {spec.n_layers} formats, "
                                     f"got {len(fmts)}")
        return cls(tuple(kv_spec(f).bytes for f in fmts), tuple(fmts))

    @property
    def uniform(self) -> KvFormat | None:
        """The one format of every block, or None (mixed, or bytes only)."""
        first = self.formats[0] if self.formats else None
        return first if all(f == first for f in self.formats) else None

    def label(self) -> str:
        """``fp8_e4m3`` for a uniform layout, ``N bytes`` without formats, else ``mixed``."""
        if self.uniform is not None:
            return self.uniform.value
        if all(f is None for f in self.formats) and len(set(self.element_bytes)) == 1:
            return f"{self.element_bytes[0]:g} bytes"
        return "mixed"


def block_token_bytes(spec: ModelSpec, element_bytes: float) -> float:
    """One block's cache bytes per token of context (K and V; MLA: latent and rotary key)."""
    return spec.cached_width * element_bytes


def cached_tokens(window: int, length: float) -> float:
    """Tokens a block keeps of a ``length``-token context (a sliding window caps it)."""
    return min(length, window) if window else length


def tokens_per_block(spec: ModelSpec, length: float) -> list[float]:
    return [cached_tokens(spec.window(i), length) for i in range(spec.n_layers)]


def cache_bytes(spec: ModelSpec, layout: KvLayout, batch: int, length: float) -> float:
    """The KV cache of ``batch`` sequences of ``length`` tokens, every block counted."""
    return batch * sum(block_token_bytes(spec, b) * t
                       for b, t in zip(layout.element_bytes, tokens_per_block(spec, length)))


def bytes_per_token(spec: ModelSpec, layout: KvLayout) -> float:
    """Cache bytes one token of context adds in full-attention blocks (what vendors quote:
    128 KiB for Llama-3-8B in BF16), all blocks summed."""
    return sum(block_token_bytes(spec, b) for b in layout.element_bytes)


__all__ = ["KvInput", "KvLayout", "block_token_bytes", "bytes_per_token", "cache_bytes",
           "cached_tokens", "tokens_per_block"]
