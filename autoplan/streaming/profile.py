"""The sensitivity profile, one decoder block at a time.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from autoplan.compress import CompressionSettings
from autoplan.models.head import chunk_rows
from autoplan.models.moe import counting_routing
from autoplan.plan.io import write_json_atomic
from autoplan.quant.kv_cache import kv_hooks
from autoplan.sensitivity.capture import Recorder, fisher_backward
from autoplan.sensitivity.executor import Executor
from autoplan.sensitivity.kv import KvRequest, kv_todo, kv_unit, record_kv, score_block
from autoplan.sensitivity.profile import (LayerChoices, ProfileRun, SensitivityProfile,
                                          cache_path, load_cached, make_task)
from autoplan.streaming.boundaries import BoundaryStore
from autoplan.streaming.skeleton import StreamedModel


def _block_of(sm: StreamedModel, name: str) -> int:
    """Block index of a layer name (-1: outside the blocks, i.e. the lm_head)."""
    for i, keys in enumerate(sm.block_keys):
        if f"{name}.weight" in keys:
            return i
    return -1


def _score_resident(run, model, layers, rec, tokens, settings, routing) -> None:  # noqa: ANN001
    """Score the resident block's `layers` from the recorder's captures (freed on return)."""
    if layers:
        cap = rec.result(tokens)
        run.score((make_task(model, n, run.todo[n], cap, settings) for n in layers), tokens,
                  routing)


def _forward(sm: StreamedModel, calib_batches: Sequence[Tensor], lowest: int,
             states: BoundaryStore) -> tuple[list[dict], list[Tensor]]:
    """Every block forward, keeping the inputs of blocks >= `lowest` in `states`; returns
    each batch's block kwargs and the last block's outputs."""
    with sm.embeddings():  # loaded once for every batch, then back to disk
        starts = [sm.block_inputs(b) for b in calib_batches]
    kwargs = [kw for _h, kw in starts]
    hidden = [h for h, _kw in starts]
    with torch.no_grad():
        for i in range(sm.n_blocks):
            if i >= lowest:
                states.put(i, hidden)
            with sm.resident(i):
                hidden = [sm.run_block(i, h, kw) for h, kw in zip(hidden, kwargs)]
    return kwargs, hidden


def _head_grads(sm: StreamedModel, hidden: list[Tensor], seed: int) -> list[Tensor]:
    """The Fisher loss's gradients at the last hidden states, with the lm_head resident:
    labels sampled as `sensitivity.capture` samples them (one generator, batch order)."""
    gen = torch.Generator().manual_seed(seed)
    rows = chunk_rows(sm.config.vocab_size)  # the logits a chunk of positions at a time
    with torch.enable_grad():
        return [fisher_backward(sm.logits, h, gen, rows).detach() for h in hidden]


def _reverse_block(sm: StreamedModel, i: int, inputs: list[Tensor], kwargs: list[dict],
                   grads: list[Tensor]) -> list[Tensor]:
    """Recompute resident block `i` from its saved inputs with grad and back-propagate the
    gradients at its output; returns the gradients at its input."""
    new_grads = []
    for x, kw, g in zip(inputs, kwargs, grads):
        x = x.to(sm.device).requires_grad_(True)
        sm.run_block(i, x, kw).backward(g)
        new_grads.append(x.grad.detach())
    return new_grads


def build_profile_streamed(
    sm: StreamedModel, layer_names: Iterable[str], choices: LayerChoices,
    calib_batches: Sequence[Tensor], *, model_hash: str, calib_hash: str,
    settings: CompressionSettings, cache_dir: Path, seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None, executor: Executor | None = None,
    offload_dir: Path | None = None,
) -> SensitivityProfile:
    """`sensitivity.build_profile`'s result, computed with one block resident at a time."""
    run = ProfileRun(layer_names, choices, model_hash=model_hash, calib_hash=calib_hash,
                     settings=settings, cache_dir=cache_dir, on_progress=on_progress,
                     executor=executor)
    if not run.todo:
        return run.profile
    by_block: dict[int, list[str]] = defaultdict(list)
    for name in run.todo:
        by_block[_block_of(sm, name)].append(name)
    lowest = min((b for b in by_block if b >= 0), default=sm.n_blocks)
    tokens = sum(b.numel() for b in calib_batches)
    states = BoundaryStore(offload_dir)
    with counting_routing(sm.model) as counter:  # MoE: the calibration routing, as capture
        kwargs, hidden = _forward(sm, calib_batches, lowest, states)
    routing = counter.as_lists()
    head_layers = by_block.pop(-1, [])
    with sm.head_resident():
        with Recorder(sm.model, head_layers) as rec:
            grads = _head_grads(sm, hidden, seed)
        del hidden
        _score_resident(run, sm.model, head_layers, rec, tokens, settings, routing)

    for i in reversed(range(lowest, sm.n_blocks)):
        layers = by_block.get(i, [])
        with sm.resident(i):
            inputs = states.pop(i)
            with torch.enable_grad(), Recorder(sm.model, layers) as rec:
                grads = _reverse_block(sm, i, inputs, kwargs, grads)
            del inputs
            _score_resident(run, sm.model, layers, rec, tokens, settings, routing)
    states.close()
    return run.profile


def build_kv_profile_streamed(
    sm: StreamedModel, request: KvRequest, calib_batches: Sequence[Tensor], *,
    model_hash: str, calib_hash: str, settings: CompressionSettings, cache_dir: Path,
    seed: int = 0, offload_dir: Path | None = None,
) -> SensitivityProfile:
    """`sensitivity.kv.build_kv_profile`'s result, one block resident at a time: every
    block's attention inputs and their Fisher gradients are recorded while the reverse pass
    recomputes it, scored, and dropped."""
    path = cache_path(cache_dir, model_hash, calib_hash, settings)
    profile = load_cached(path, model_hash, calib_hash, settings)
    todo = kv_todo(profile, range(sm.n_blocks), request)
    if not todo:
        return profile
    tokens = sum(b.numel() for b in calib_batches)
    states = BoundaryStore(offload_dir)
    kwargs, hidden = _forward(sm, calib_batches, 0, states)
    with sm.head_resident():
        grads = _head_grads(sm, hidden, seed)
    del hidden
    for i in reversed(range(sm.n_blocks)):
        with sm.resident(i):
            inputs = states.pop(i)
            recs = record_kv([i])
            with torch.enable_grad(), kv_hooks(sm.model, recs):
                grads = _reverse_block(sm, i, inputs, kwargs, grads)
            del inputs
            profile.kv.setdefault(kv_unit(i), {}).update(score_block(i, recs[i], todo, tokens))
    states.close()
    write_json_atomic(path, profile.to_json())
    return profile


__all__ = ["build_kv_profile_streamed", "build_profile_streamed"]
