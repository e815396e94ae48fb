"""Perplexity and KL(P_orig || P_compressed) on token blocks, one forward pass per model.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoplan.errors import UserInputError
from autoplan.models.head import CHUNK, block_logits, chunk_rows


@dataclass(frozen=True)
class ReferenceLogprobs:
    """The original model's log-softmax over ``tokens`` and its mean next-token NLL."""

    tokens: torch.Tensor = field(repr=False)  # int64 [n, seq_len]
    logprobs: torch.Tensor = field(repr=False)  # fp16 [n, seq_len, vocab]
    nll: float  # mean next-token negative log-likelihood (nats)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


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


def _chunk_nll(lp: torch.Tensor, block: torch.Tensor, start: int) -> float:
    """Summed NLL of the targets a chunk of one block predicts: positions start.. of `lp`
    [c, vocab] predict tokens start+1.. of `block` [seq] (the block's last has none)."""
    n = min(lp.shape[0], block.shape[0] - 1 - start)
    if n <= 0:
        return 0.0
    return float(-lp[:n].gather(-1, block[start + 1:start + 1 + n, None]).double().sum())


def block_terms(chunks: Iterable[tuple[int, int, torch.Tensor]], tokens: torch.Tensor,
                ref_logprobs: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> tuple[list[float], list[float]]:
    """Per block of a batch: its summed NLL and (with the reference's log-probs of the same
    blocks, [b, seq, vocab]) its summed KL, from the batch's logits chunk by chunk
    (``models.head.block_logits``: (block, first position, logits [c, vocab])).

    Each chunk is reduced on its own and a block's total is the ``math.fsum`` of its chunks
    (exactly rounded, order-free), so no figure depends on how blocks were grouped into
    forward passes: streamed or in memory, bounded or not, any batch size. ``keep``
    ([b, seq, vocab] fp16) receives the log-probs (the reference pass stores them there).
    """
    n = tokens.shape[0]
    nll: list[list[float]] = [[] for _ in range(n)]
    kl: list[list[float]] = [[] for _ in range(n)]
    for b, start, logits in chunks:
        lp = torch.log_softmax(logits.float(), dim=-1)
        del logits
        end = start + lp.shape[0]
        nll[b].append(_chunk_nll(lp, tokens[b].to(lp.device), start))
        if ref_logprobs is not None:
            kl[b].append(kl_sum(ref_logprobs[b, start:end].to(lp.device), lp))
        if keep is not None:
            keep[b, start:end] = lp.half().to(keep.device)
    kls = [] if ref_logprobs is None else [math.fsum(k) for k in kl]
    return [math.fsum(x) for x in nll], kls


def check_tokens(tokens: torch.Tensor) -> torch.Tensor:
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] < 2:
        raise UserInputError("evaluation tokens must be a non-empty [n_blocks, seq_len>=2] tensor; "
                             "build them with load_text_dataset(n_eval>=1)")
    return tokens.long()


@torch.inference_mode()
def reference_pass(model: nn.Module, tokens: torch.Tensor, *, batch_size: int = 4) -> ReferenceLogprobs:
    """Run the original model once and keep what each later comparison needs. Its log-probs
    are written into one fp16 tensor chunk by chunk (no fp32 copy of them all exists)."""
    tokens = check_tokens(tokens)
    logprobs: torch.Tensor | None = None
    nlls: list[float] = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = tokens[i:i + batch_size]
        chunks = block_logits(model, batch.to(_device(model)), _rows(model))
        first = next(chunks)
        if logprobs is None:
            logprobs = torch.empty((*tokens.shape, first[2].shape[-1]), dtype=torch.float16,
                                   device=first[2].device)
        nlls += block_terms(_chain(first, chunks), batch, keep=logprobs[i:i + batch_size])[0]
    n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
    return ReferenceLogprobs(tokens, logprobs, math.fsum(nlls) / n_targets)


def _chain(first, rest):  # noqa: ANN001, ANN202 - an iterator with its first item back in front
    yield first
    yield from rest


def _device(model: Any) -> torch.device | str:
    params = getattr(model, "parameters", None)
    try:
        return next(params()).device if callable(params) else "cpu"
    except StopIteration:
        return "cpu"


def _rows(model: Any) -> int:
    """Positions per chunk for this model's vocabulary (its config's, else the default)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return chunk_rows(int(vocab)) if isinstance(vocab, int) and vocab > 0 else CHUNK


@torch.inference_mode()
def compare_pass(model: nn.Module, ref: ReferenceLogprobs, *, batch_size: int = 4
                 ) -> tuple[float, float]:
    """Mean next-token NLL of ``model`` and mean per-token KL(P_ref || P_model), in nats.

    KL is averaged over every position of every block (each position has a next-token
    distribution, target or not); NLL over positions that have a target.
    """
    nll, kl, _ = bounded_compare_pass(model, ref, batch_size=batch_size)
    return nll, kl


def kl_slack(vocab: int) -> float:
    """How far below 0 one position's ``kl_sum`` term can fall: the model's log-probs are
    rounded to fp16 (relative error <= 2^-11) before the difference, which moves the term
    by at most 2^-11 x the cross-entropy sum p |log q|, and for the part of it that is not
    KL itself by at most 2^-11 x the entropy H(p) <= ln(vocab)."""
    return 2.0 ** -11 * math.log(vocab)


@torch.inference_mode()
def bounded_compare_pass(model: nn.Module, ref: ReferenceLogprobs, *, batch_size: int = 4,
                         kl_limit: float | None = None) -> tuple[float, float, int]:
    """``compare_pass`` that may stop early: (mean NLL, mean KL, blocks measured).

    Blocks are summed one by one in order, so the figures do not depend on how blocks are
    grouped into forward passes (the logits are the same per block). With ``kl_limit``, the
    first pass takes one block alone, and the pass stops as soon as the final mean KL is
    certain to exceed the limit: every position left can lower the sum by at most
    ``kl_slack`` (KL itself is >= 0), so
        final KL >= (sum so far - positions left x slack) / all positions  > kl_limit.
    It then returns that lower bound as the KL and the NLL of the blocks measured (blocks
    measured < all blocks says so). Without a limit, or when the bound never passes it,
    the result is the full pass's, bit for bit.
    """
    tokens = ref.tokens
    n_blocks, seq = tokens.shape
    slack = kl_slack(ref.logprobs.shape[-1])
    nlls: list[float] = []
    kls: list[float] = []
    starts = [0, 1] if kl_limit is not None else [0]
    starts += list(range(starts[-1] + batch_size, n_blocks, batch_size))
    for i, j in zip(starts, [*starts[1:], n_blocks], strict=True):
        if i >= n_blocks:
            break
        batch = tokens[i:j]
        nll, kl = block_terms(block_logits(model, batch.to(_device(model)),
                                           chunk_rows(ref.logprobs.shape[-1])),
                              batch, ref.logprobs[i:j])
        nlls += nll
        kls += kl
        left = (n_blocks - len(kls)) * seq
        if kl_limit is not None and left:
            bound = (math.fsum(kls) - left * slack) / tokens.numel()
            if bound > kl_limit:
                return math.fsum(nlls) / (len(nlls) * (seq - 1)), bound, len(kls)
    return math.fsum(nlls) / (n_blocks * (seq - 1)), math.fsum(kls) / tokens.numel(), n_blocks


__all__ = ["ReferenceLogprobs", "block_terms", "bounded_compare_pass", "check_tokens",
           "compare_pass", "kl_slack", "kl_sum", "nll_sum", "reference_pass"]
