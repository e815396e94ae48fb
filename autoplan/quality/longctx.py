"""A synthetic long-context check: passkey retrieval at several depths and lengths.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoplan.errors import UserInputError
from autoplan.models.head import selected_logits

INTRO = "A pass key is hidden in this text. Find it and remember it.\n"
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"
DEPTHS = (0.1, 0.5, 0.9)
MIN_LEN = 64


@dataclass(frozen=True)
class LongContextCase:
    length: int
    depth: float
    key: str
    prompt_ids: tuple[int, ...] = field(repr=False)
    key_ids: tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class LongContextScore:
    score: float  # 0-100, see docs/modules.md
    accuracy: float  # 0-100
    per_length: dict[int, float]  # length -> score


def default_lengths(context: int, max_len: int | None = None) -> tuple[int, ...]:
    """The context and its halves down to an eighth (>= MIN_LEN), capped at ``max_len``."""
    top = min(context, max_len) if max_len else context
    lengths = sorted({top >> k for k in range(4) if top >> k >= MIN_LEN})
    if not lengths:
        raise UserInputError(f"a long-context check needs at least {MIN_LEN} tokens of "
                             f"context, the model has {context}")
    return tuple(lengths)


def model_context(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or n < MIN_LEN:
        raise UserInputError("the model's config has no max_position_embeddings: pass "
                             "longctx:MAXLEN>=-POINTS with the context length")
    return n


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_cases(tokenizer: Any, lengths: tuple[int, ...], depths: tuple[float, ...] = DEPTHS,
                seed: int = 0) -> tuple[LongContextCase, ...]:
    """One passkey prompt per (length, depth), each ``length`` tokens long with its key."""
    rng = random.Random(seed)
    intro, filler, question = _ids(tokenizer, INTRO), _ids(tokenizer, FILLER), \
        _ids(tokenizer, QUESTION)
    cases = []
    for length in lengths:
        for depth in depths:
            key = str(rng.randint(10000, 99999))
            needle = _ids(tokenizer, NEEDLE.format(key=key))
            key_ids = _ids(tokenizer, " " + key)
            room = length - len(intro) - len(needle) - len(question) - len(key_ids)
            if room < len(filler):  # too short to hide anything: a shorter model's lengths
                continue
            pad = (filler * (room // len(filler) + 1))[:room]
            cut = int(round(depth * room))
            prompt = intro + pad[:cut] + needle + pad[cut:] + question
            cases.append(LongContextCase(length, depth, key, tuple(prompt), tuple(key_ids)))
    if not cases:
        raise UserInputError(f"no long-context case fits in {max(lengths)} tokens with this "
                             "tokenizer: raise longctx:MAXLEN")
    return tuple(cases)


@torch.inference_mode()
def score_cases(model: nn.Module, cases: tuple[LongContextCase, ...]) -> LongContextScore:
    """Teacher-forced log-probabilities of every case's key tokens (one forward per case)."""
    probs, hits = [], []
    by_len: dict[int, list[float]] = {}
    device = next(model.parameters()).device
    for case in cases:
        ids = torch.tensor([case.prompt_ids + case.key_ids])
        pick = torch.zeros_like(ids, dtype=torch.bool)
        pick[0, len(case.prompt_ids) - 1:ids.shape[1] - 1] = True  # they predict the key
        lp = torch.log_softmax(selected_logits(model, ids.to(device), pick.to(device)).cpu(),
                               dim=-1)
        target = torch.tensor(case.key_ids)
        p = math.exp(float(lp.gather(-1, target[:, None]).mean()))
        probs.append(p)
        hits.append(bool((lp.argmax(-1) == target).all()))
        by_len.setdefault(case.length, []).append(p)
    n = len(cases)
    return LongContextScore(100 * sum(probs) / n, 100 * sum(hits) / n,
                            {k: 100 * sum(v) / len(v) for k, v in sorted(by_len.items())})


class LongContextGate:
    """The check as a quality gate: ``score(model)`` in 0-100 points, higher is better."""

    def __init__(self, tokenizer: Any, model: nn.Module, *, max_len: int | None = None,
                 depths: tuple[float, ...] = DEPTHS, seed: int = 0) -> None:
        self.name = "longctx"
        self.lengths = default_lengths(model_context(model), max_len)
        self.cases = build_cases(tokenizer, self.lengths, depths, seed)

    def score(self, model: nn.Module) -> tuple[float, dict[str, float]]:
        s = score_cases(model, self.cases)
        detail = {"accuracy": s.accuracy} | {f"len{k}": v for k, v in s.per_length.items()}
        return s.score, detail


__all__ = ["DEPTHS", "LongContextCase", "LongContextGate", "LongContextScore", "build_cases",
           "default_lengths", "model_context", "score_cases"]
