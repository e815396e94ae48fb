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
from autoplan.sensitivity.capture import Recorder, fisher_backward
from autoplan.sensitivity.executor import Executor
from autoplan.sensitivity.profile import LayerChoices, ProfileRun, SensitivityProfile, make_task
from autoplan.streaming.boundaries import BoundaryStore
from autoplan.streaming.skeleton import StreamedModel


def _block_of(sm: StreamedModel, name: str) -> int:
    """Block index of a layer name (-1: outside the blocks, i.e. the lm_head)."""
    for i, keys in enumerate(sm.block_keys):
        if f"{name}.weight" in keys:
            return i
    return -1


def _score_resident(run, model, layers, rec, tokens, settings) -> None:  # noqa: ANN001
    """Score the resident block's `layers` from the recorder's captures (freed on return)."""
    if layers:
        cap = rec.result(tokens)
        run.score((make_task(model, n, run.todo[n], cap, settings) for n in layers), tokens)


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
    dev = sm.device

    with sm.embeddings():  # loaded once for every batch, then back to disk
        starts = [sm.block_inputs(b) for b in calib_batches]
    kwargs = [kw for _h, kw in starts]
    states = BoundaryStore(offload_dir)
    hidden = [h for h, _kw in starts]
    with torch.no_grad():
        for i in range(sm.n_blocks):
            if i >= lowest:
                states.put(i, hidden)
            with sm.resident(i):
                hidden = [sm.run_block(i, h, kw) for h, kw in zip(hidden, kwargs)]

    # Head: sample labels in batch order from one generator, as the in-memory capture does.
    gen = torch.Generator().manual_seed(seed)
    grads: list[Tensor] = []
    head_layers = by_block.pop(-1, [])
    with sm.head_resident():
        with torch.enable_grad(), Recorder(sm.model, head_layers) as rec:
            rows = chunk_rows(sm.config.vocab_size)
            for h in hidden:
                grads.append(fisher_backward(sm.logits, h, gen, rows).detach())
        del hidden
        _score_resident(run, sm.model, head_layers, rec, tokens, settings)

    for i in reversed(range(lowest, sm.n_blocks)):
        layers = by_block.get(i, [])
        with sm.resident(i):
            inputs = states.pop(i)
            with torch.enable_grad(), Recorder(sm.model, layers) as rec:
                new_grads = []
                for x, kw, g in zip(inputs, kwargs, grads):
                    x = x.to(dev).requires_grad_(True)
                    sm.run_block(i, x, kw).backward(g)
                    new_grads.append(x.grad.detach())
            grads = new_grads
            del inputs
            _score_resident(run, sm.model, layers, rec, tokens, settings)
    states.close()
    return run.profile


__all__ = ["build_profile_streamed"]
