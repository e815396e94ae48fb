"""Quality of an exported ONNX artifact itself: KL and perplexity of ORT's logits against the
original PyTorch model on the evaluation split.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np


class _OrtLogits:
    """`model(input_ids=[B, S]) -> .logits [B, S, V]` over an autoplan ONNX decoder."""

    def __init__(self, model_path: str | Path, threads: int | None = None) -> None:
        from autoplan.backends.cpu.ort_runtime import OrtGenerator

        self.gen = OrtGenerator(model_path, threads=threads)

    def __call__(self, input_ids: Any, use_cache: bool = False) -> SimpleNamespace:
        import torch

        ids = np.ascontiguousarray(input_ids.numpy(), dtype=np.int64)
        batch, seq = ids.shape
        empty = self.gen._empty_cache(batch)  # noqa: SLF001 - same package, same contract
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64),
                 "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
                 "logits_to_keep": np.array([seq], np.int64), **empty}
        logits = self.gen.session.run(["logits"], feeds)[0]
        return SimpleNamespace(logits=torch.from_numpy(logits))


def logits_quality(model: Any, ref: Any) -> dict[str, float]:
    """KL(original || model) per token (nats) and perplexity on ``ref``'s tokens.

    Args:
        model: any callable ``model(input_ids=[B, S], use_cache=False) -> .logits [B, S, V]``
            (an ONNX session, a peer engine's worker, a transformers model).
        ref: autoplan.quality.metrics.ReferenceLogprobs of the original model.
    """
    from autoplan.quality.metrics import compare_pass

    nll, kl = compare_pass(model, ref)
    return {"kl": kl, "ppl": math.exp(nll), "ppl_ref": ref.ppl,
            "eval_tokens": int(ref.tokens.numel())}


def artifact_quality(model_path: str | Path, ref: Any, threads: int | None = None
                     ) -> dict[str, float]:
    """KL(original || artifact) per token (nats) and perplexity on `ref`'s tokens.

    Args:
        ref: autoplan.quality.metrics.ReferenceLogprobs of the original model.
    """
    return logits_quality(_OrtLogits(model_path, threads), ref)


__all__ = ["artifact_quality", "logits_quality"]
