"""The original model's reference log-probabilities, cached on disk per evaluation split.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch

from autoplan.atomic import write_parts_atomic
from autoplan.quality.metrics import ReferenceLogprobs
from autoplan.safetensors_io import safetensors_parts

CACHE_VERSION = 3  # 2: NLL summed per block (metrics.block_terms); 3: per chunk of positions


def reference_key(model_hash: str, tokens: torch.Tensor, *, execution: str, device: str,
                  batch_size: int) -> str:
    h = hashlib.sha256(f"autoplan-reference-v{CACHE_VERSION}|{model_hash}|{execution}|{device}|"
                       f"{torch.__version__}|{torch.get_num_threads()}|{batch_size}|"
                       f"{tuple(tokens.shape)}|".encode())
    h.update(tokens.cpu().to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def cached_reference(cache_dir: Path, key: str, tokens: torch.Tensor,
                     compute: Callable[[], ReferenceLogprobs]) -> ReferenceLogprobs:
    """The reference stored under `key`, else `compute()` stored there and returned."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(cache_dir) / f"reference-{key}.safetensors"
    if path.is_file():
        try:
            got = load_file(path)
            if torch.equal(got["tokens"], tokens.cpu().to(torch.int64)):
                dev = tokens.device  # where the evaluator computes (the GPU in memory mode)
                return ReferenceLogprobs(got["tokens"].to(dev), got["logprobs"].to(dev),
                                         float(got["nll"]))
        except (SafetensorError, OSError, KeyError, ValueError, RuntimeError):
            pass  # unreadable or foreign: recomputed below
    ref = compute()
    write_parts_atomic(path, safetensors_parts({
        "tokens": ref.tokens.cpu().to(torch.int64),
        "logprobs": ref.logprobs.cpu(),
        "nll": torch.tensor(ref.nll, dtype=torch.float64)}))
    return ref


__all__ = ["cached_reference", "reference_key"]
