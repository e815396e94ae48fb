"""Quality of a GGUF measured through llama.cpp's own logits: KL to the original and perplexity.

``llamacpp_quality`` measures a GGUF the way ``QualityEvaluator`` measures a torch model
(``autoplan.quality.metrics``: mean per-position KL(P_ref || P) with fp16 reference
log-probs, perplexity over the positions that have a target), except that both
distributions are llama.cpp's own: ``llamacpp_reference`` runs the original GGUF once and
each candidate file is then one pass over the same blocks (one sequence per block, from an
empty KV cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autoplan.engines.llamacpp import LlamaCppWorker
from autoplan.errors import UserInputError


@dataclass(frozen=True)
class LlamaCppReference:
    """The original GGUF's llama.cpp log-probs on the evaluation tokens (fp16, as
    ``autoplan.quality.metrics.ReferenceLogprobs``) and its mean next-token NLL."""

    tokens: torch.Tensor = field(repr=False)  # int64 [n_blocks, seq_len]
    logprobs: torch.Tensor = field(repr=False)  # fp16 [n_blocks, seq_len, vocab]
    nll: float
    gguf: str

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def _block_logprobs(worker: LlamaCppWorker, block: torch.Tensor) -> torch.Tensor:
    logits = torch.from_numpy(worker.logits(block.numpy()))
    return torch.log_softmax(logits.float(), dim=-1)[None]


def _check_tokens(tokens: torch.Tensor) -> torch.Tensor:
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] < 2:
        raise UserInputError("evaluation tokens must be a non-empty [n_blocks, seq_len>=2] "
                             "tensor; build them with load_text_dataset(n_eval>=1)")
    return tokens.long()


def llamacpp_reference(gguf: str | Path, tokens: torch.Tensor, *,
                       threads: int | None = None) -> LlamaCppReference:
    """Run the reference GGUF once over every evaluation block (one sequence per block)."""
    from autoplan.quality.metrics import nll_sum

    tokens = _check_tokens(tokens)
    chunks, nll = [], 0.0
    with LlamaCppWorker(gguf, threads=threads, n_ctx=tokens.shape[1], logits_all=True) as w:
        for block in tokens:
            lp = _block_logprobs(w, block)
            nll += nll_sum(lp, block[None])
            chunks.append(lp.half())
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return LlamaCppReference(tokens, torch.cat(chunks), nll / n_targets, str(gguf))


def llamacpp_quality(gguf: str | Path, reference: LlamaCppReference, *,
                     threads: int | None = None) -> dict[str, float]:
    """KL to the reference and perplexity of a GGUF, both through llama.cpp's logits.

    Returns:
        ``{"kl", "ppl", "ppl_ref", "n_tokens"}``: mean per-position KL(P_ref || P) in
        nats (0 for the reference file itself), perplexities of the model and reference.
    """
    from autoplan.quality.metrics import kl_sum, nll_sum

    tokens = reference.tokens
    nll, kl = 0.0, 0.0
    with LlamaCppWorker(gguf, threads=threads, n_ctx=tokens.shape[1], logits_all=True) as w:
        for i, block in enumerate(tokens):
            lq = _block_logprobs(w, block)
            nll += nll_sum(lq, block[None])
            kl += kl_sum(reference.logprobs[i:i + 1], lq)
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return {"kl": kl / tokens.numel(), "ppl": math.exp(nll / n_targets),
            "ppl_ref": reference.ppl, "n_tokens": int(tokens.numel())}


__all__ = ["LlamaCppReference", "llamacpp_quality", "llamacpp_reference"]
