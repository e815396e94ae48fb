"""Perplexity and KL(P_orig || P_compressed) on token blocks, one forward pass per model.

The reference pass stores the original model's full-vocabulary log-probabilities in fp16.
Why full vocabulary: on SmolLM2-135M a top-k cache is badly biased (k=256 leaves 6.7% of the
probability in the tail and under-reports KL by ~11%). Why fp16: measured against fp32 on
pydoc text, fp16 log-probs change KL by ~4e-6 nats (0.4% at KL=1e-3), bf16 by ~7e-5.
Memory: tokens x vocab x 2 bytes (2048 tokens x 49152 = 201 MB for the default eval set).

The compared model's log-probs are rounded to fp16 the same way before the difference, so a
model identical to the reference scores KL = 0 exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from autoplan.errors import UserInputError


@dataclass(frozen=True)
class ReferenceLogprobs:
    """The original model's log-softmax over ``tokens`` and its mean next-token NLL."""

    tokens: torch.Tensor = field(repr=False)  # int64 [n, seq_len]
    logprobs: torch.Tensor = field(repr=False)  # fp16 [n, seq_len, vocab]
    nll: float  # mean next-token negative log-likelihood (nats)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def _logprobs(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=tokens, use_cache=False)
    return torch.log_softmax(out.logits.float(), dim=-1)


def nll_sum(logprobs: torch.Tensor, tokens: torch.Tensor) -> float:
    """Summed next-token NLL of ``tokens`` [b, seq] under ``logprobs`` [b, seq, vocab]."""
    # position t predicts token t+1; the last position of a block has no target
    picked = logprobs[:, :-1].gather(-1, tokens[:, 1:, None])
    return float(-picked.double().sum())


def kl_sum(ref_logprobs: torch.Tensor, logprobs: torch.Tensor) -> float:
    """Summed per-position KL(P_ref || P) from fp16 reference log-probs and float log-probs
    (rounded to fp16 first, so a model identical to the reference scores exactly 0)."""
    lp = ref_logprobs.float()
    lq = logprobs.half().float()
    p = lp.exp()
    # p = 0 terms are 0 by convention, even where the model says -inf
    return float(torch.where(p > 0, p * (lp - lq), 0.0).sum(-1).double().sum())


def check_tokens(tokens: torch.Tensor) -> torch.Tensor:
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] < 2:
        raise UserInputError("evaluation tokens must be a non-empty [n_blocks, seq_len>=2] tensor; "
                             "build them with load_text_dataset(n_eval>=1)")
    return tokens.long()


@torch.inference_mode()
def reference_pass(model: nn.Module, tokens: torch.Tensor, *, batch_size: int = 4) -> ReferenceLogprobs:
    """Run the original model once and keep what each later comparison needs."""
    tokens = check_tokens(tokens)
    chunks, nll = [], 0.0
    for i in range(0, tokens.shape[0], batch_size):
        batch = tokens[i:i + batch_size]
        lp = _logprobs(model, batch)
        nll += nll_sum(lp, batch)
        chunks.append(lp.half())
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return ReferenceLogprobs(tokens, torch.cat(chunks), nll / n_targets)


@torch.inference_mode()
def compare_pass(model: nn.Module, ref: ReferenceLogprobs, *, batch_size: int = 4
                 ) -> tuple[float, float]:
    """Mean next-token NLL of ``model`` and mean per-token KL(P_ref || P_model), in nats.

    KL is averaged over every position of every block (each position has a next-token
    distribution, target or not); NLL over positions that have a target.
    """
    tokens = ref.tokens
    nll, kl = 0.0, 0.0
    for i in range(0, tokens.shape[0], batch_size):
        batch = tokens[i:i + batch_size]
        lq = _logprobs(model, batch)
        nll += nll_sum(lq, batch)
        kl += kl_sum(ref.logprobs[i:i + batch_size], lq)
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return nll / n_targets, kl / tokens.numel()


__all__ = ["ReferenceLogprobs", "check_tokens", "compare_pass", "kl_sum", "nll_sum", "reference_pass"]
