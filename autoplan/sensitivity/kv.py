"""KV-cache formats in the sensitivity profile: a KL estimate per block and cache format.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from autoplan.compress import CompressionSettings
from autoplan.formats.kv import KvFormat
from autoplan.models.head import chunk_rows, split_lm
from autoplan.plan.io import write_json_atomic
from autoplan.quant.kv_cache import KvAmax, KvQuant, attention_modules, kv_hooks, kv_quants
from autoplan.sensitivity.capture import activation_grads, fisher_backward, fisher_loss
from autoplan.sensitivity.profile import SensitivityProfile, cache_path, load_cached

# the formats to score, each with the query rounding of the engine that serves it
KvRequest = Mapping[KvFormat, KvFormat | None]


def kv_unit(block: int) -> str:
    """The profile's name for a block's KV cache."""
    return f"kv_cache.{block}"


def kv_key(fmt: KvFormat, query: KvFormat | None) -> str:
    """The profile's name for a cache format under an engine's query rounding."""
    return f"{fmt.value}+q:{query.value}" if query is not None else fmt.value


@dataclass
class _Recorded:
    """One block's (q, k, v) per batch and their gradients, as attention received them."""

    tensors: list[tuple[Tensor, Tensor, Tensor]] = field(default_factory=list)
    grads: list[dict[str, Tensor]] = field(default_factory=list)
    amax: KvAmax = field(default_factory=KvAmax)

    def __call__(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self.amax(query, key, value)
        self.tensors.append((query.detach().float(), key.detach().float(),
                             value.detach().float()))
        slot: dict[str, Tensor] = {}
        self.grads.append(slot)
        for name, t in (("q", query), ("k", key), ("v", value)):
            if t.requires_grad:
                t.register_hook(lambda g, name=name, slot=slot: slot.__setitem__(
                    name, g.detach().float()))
        return query, key, value


@dataclass
class KvCapture:
    """Per block: its calibration (q, k, v), their Fisher gradients and their amax."""

    blocks: dict[int, _Recorded]
    tokens: int

    def amax(self) -> dict[int, KvAmax]:
        return {i: r.amax for i, r in self.blocks.items()}


def record_kv(blocks: Iterable[int]) -> dict[int, _Recorded]:
    """Fresh recorders for ``kv_hooks`` (the streamed profile drives them block by block)."""
    return {i: _Recorded() for i in blocks}


def capture_kv(model: nn.Module, batches: Iterable[Tensor], *, seed: int = 0) -> KvCapture:
    """Forward + backward over ``batches`` with sampled Fisher labels (the generator and
    order of ``sensitivity.capture``), recording every block's attention inputs."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    recs = record_kv(attention_modules(model))
    tokens = 0
    split = split_lm(model)
    rows = chunk_rows(model.config.vocab_size)
    with activation_grads(model), kv_hooks(model, recs):
        for batch in batches:
            if split is None:
                fisher_loss(model(input_ids=batch.to(device), use_cache=False).logits,
                            gen).backward()
            else:  # the head a chunk of positions at a time (models/head.py)
                fisher_backward(split.head, split.body(batch.to(device)), gen, rows)
            tokens += batch.numel()
    return KvCapture(recs, tokens)


@torch.no_grad()
def score_recorded(rec: _Recorded, quant: KvQuant, tokens: int) -> float:
    """1/2 sum (G * dX)^2 / tokens over one block's recorded q, k, v."""
    total = 0.0
    for (q, k, v), g in zip(rec.tensors, rec.grads):
        q2, k2, v2 = quant(q, k, v)
        for name, x, x2 in (("q", q, q2), ("k", k, k2), ("v", v, v2)):
            if name in g and x2 is not x:
                total += float(((x2 - x) * g[name]).square().sum())
    return 0.5 * total / max(tokens, 1)


def score_block(block: int, rec: _Recorded, request: KvRequest, tokens: int
                ) -> dict[str, float]:
    """One block's ``{kv_key(format, query): score}``; the static scales come from the
    recorder's own amax (the calibration batches)."""
    out = {}
    for fmt, query in request.items():
        quant = kv_quants({block: fmt}, {block: rec.amax}, query)[block]
        out[kv_key(fmt, query)] = score_recorded(rec, quant, tokens)
    return out


def score_kv(capture: KvCapture, formats: Sequence[KvFormat], query: KvRequest
             ) -> dict[str, dict[str, float]]:
    """``kv_unit(block) -> {kv_key(format, query): score}`` for every block and format."""
    request = {f: query.get(f) for f in formats}
    return {kv_unit(i): score_block(i, rec, request, capture.tokens)
            for i, rec in capture.blocks.items()}


def kv_todo(profile: SensitivityProfile, blocks: Iterable[int], request: KvRequest) -> KvRequest:
    """The formats of ``request`` some block has no score for yet."""
    return {f: q for f, q in request.items()
            if any(kv_key(f, q) not in profile.kv.get(kv_unit(i), {}) for i in blocks)}


def build_kv_profile(model: nn.Module, request: KvRequest, calib_batches: Sequence[Tensor], *,
                     model_hash: str, calib_hash: str, settings: CompressionSettings,
                     cache_dir: Path, seed: int = 0) -> SensitivityProfile:
    """The cached profile with every block scored for every requested cache format (one
    capture pass when some are missing), written back to the profile's file."""
    path = cache_path(cache_dir, model_hash, calib_hash, settings)
    profile = load_cached(path, model_hash, calib_hash, settings)
    todo = kv_todo(profile, attention_modules(model), request)
    if todo:
        cap = capture_kv(model, calib_batches, seed=seed)
        for unit, scores in score_kv(cap, list(todo), todo).items():
            profile.kv.setdefault(unit, {}).update(scores)
        write_json_atomic(path, profile.to_json())
    return profile


__all__ = ["KvCapture", "KvRequest", "build_kv_profile", "capture_kv", "kv_key", "kv_todo",
           "kv_unit", "record_kv", "score_block", "score_kv", "score_recorded"]
