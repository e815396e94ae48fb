"""A causal LM as its decoder (run once per batch) and its head (lm_head and any final
soft-cap, run on a chunk of positions at a time): logits memory scales with the chunk.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

CHUNK = 128  # positions per head call when the vocabulary is not known
# fp32 logits per head call: with log-softmax, its exponent and the KL's temporaries about
# six such copies are alive at once, whatever the vocabulary
CHUNK_BYTES = 64 * 2**20


def chunk_rows(vocab: int) -> int:
    """Positions per head call: CHUNK_BYTES of fp32 logits (16..1024 positions), so the
    logits' peak is the same for any vocabulary (64 positions at 262k, 341 at 49k)."""
    return max(16, min(1024, CHUNK_BYTES // (4 * vocab)))


@dataclass(frozen=True)
class SplitLM:
    """`body(input_ids) -> hidden [b, seq, h]` (final norm applied) and `head(hidden[..., h])
    -> logits [..., vocab]`."""

    body: Callable[..., Tensor]  # (input_ids, **forward kwargs such as attention_mask)
    head: Callable[[Tensor], Tensor]


def _unwrapped(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (its LoRA layers are in its tree)."""
    inner = getattr(model, "get_base_model", None)
    return inner() if callable(inner) else model


def split_lm(model: Any) -> SplitLM | None:
    """The decoder and head of a transformers CausalLM, or None when `model` is not one."""
    lm = _unwrapped(model)
    if not isinstance(lm, nn.Module):
        return None
    base = getattr(lm, "base_model", None)
    get_head = getattr(lm, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if base is None or base is lm or not isinstance(head, nn.Module):
        return None
    cap = getattr(getattr(lm, "config", None), "final_logit_softcapping", None)

    def body(input_ids: Tensor, **kwargs: Any) -> Tensor:
        return base(input_ids=input_ids, use_cache=False, **kwargs).last_hidden_state

    def logits(hidden: Tensor) -> Tensor:
        out = head(hidden)
        return torch.tanh(out / cap) * cap if cap else out

    return SplitLM(body, logits)


def block_logits(model: Any, batch: Tensor, chunk: int = CHUNK
                 ) -> Iterator[tuple[int, int, Tensor]]:
    """(block index in the batch, first position, fp32 logits [c, vocab]) for every chunk of
    `chunk` positions of each block of `batch` ([b, seq] token ids), block by block.

    A model `split_lm` cannot split is called once and its logits sliced (the chunks'
    values are the same; only the peak is not bounded)."""
    split = split_lm(model)
    if split is None:
        full = model(input_ids=batch, use_cache=False).logits
        for b in range(full.shape[0]):
            for s in range(0, full.shape[1], chunk):
                yield b, s, full[b, s:s + chunk].float()
        return
    hidden = split.body(batch)
    yield from head_chunks(split.head, hidden, chunk)


def selected_logits(model: Any, batch: Tensor, pick: Tensor, chunk: int = CHUNK,
                    **kwargs: Any) -> Tensor:
    """fp32 logits [n, vocab] at the positions `pick` ([b, seq] bool) selects, in
    `batch[pick]` order: the head runs on those positions only (a long-context check needs
    a few of thousands; a slice a subset). `kwargs` go to the forward (attention_mask)."""
    split = split_lm(model)
    if split is None:
        return model(input_ids=batch, use_cache=False, **kwargs).logits[pick].float()
    rows = split.body(batch, **kwargs)[pick]
    return torch.cat([split.head(rows[s:s + chunk]).float()
                      for s in range(0, rows.shape[0], chunk)]) if rows.shape[0] else \
        split.head(rows).float()


def head_chunks(head: Callable[[Tensor], Tensor], hidden: Tensor, chunk: int = CHUNK
                ) -> Iterator[tuple[int, int, Tensor]]:
    """`head` over `hidden` [b, seq, h] chunk by chunk: (block, first position, fp32 logits
    [c, vocab])."""
    for b in range(hidden.shape[0]):
        for s in range(0, hidden.shape[1], chunk):
            yield b, s, head(hidden[b, s:s + chunk]).float()


def row_chunks(head: Callable[[Tensor], Tensor], hidden: Tensor, chunk: int = CHUNK
               ) -> Iterator[tuple[int, Tensor, Tensor]]:
    """`head` over the rows of `hidden` flattened to [b x seq, h], in order, `chunk` rows at
    a time: (first row, the rows' hidden states [c, h], logits [c, vocab]) -- the order in
    which a whole-batch `logits.reshape(-1, vocab)` lists them (same random draws)."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    for s in range(0, rows.shape[0], chunk):
        part = rows[s:s + chunk]
        yield s, part, head(part)


__all__ = ["CHUNK", "CHUNK_BYTES", "SplitLM", "block_logits", "chunk_rows", "head_chunks",
           "row_chunks", "selected_logits", "split_lm"]
