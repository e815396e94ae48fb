"""The user's own prompt suite: JSONL of {"prompt": ..., "reference": ...}, scored 0-100.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoplan.errors import UserInputError
from autoplan.models.head import selected_logits
from autoplan.quality.text import read_jsonl


@dataclass(frozen=True)
class SuiteItem:
    """One tokenized prompt and its reference answer."""

    prompt_ids: tuple[int, ...]
    reference_ids: tuple[int, ...]


@dataclass(frozen=True)
class PromptSuite:
    """A tokenized suite; ``content_hash`` covers the token ids (for caches and plans)."""

    items: tuple[SuiteItem, ...] = field(repr=False)
    content_hash: str
    source: str


@dataclass(frozen=True)
class SuiteScore:
    """A model's suite results (definitions in docs/modules.md)."""

    score: float  # 0-100
    agreement: float  # 0-100
    loglik: float  # mean over prompts of mean per-token log-likelihood of the reference (nats)


@dataclass(frozen=True)
class SuiteReference:
    """The original model's greedy continuations and its own scores on the suite."""

    suite: PromptSuite = field(repr=False)
    greedy: tuple[tuple[int, ...], ...] = field(repr=False)
    score: SuiteScore


def _read_records(path: Path) -> list[tuple[str, str]]:
    records = []
    for lineno, rec in read_jsonl(path):
        if not (isinstance(rec, dict) and isinstance(rec.get("prompt"), str)
                and isinstance(rec.get("reference"), str) and rec["reference"].strip()):
            raise UserInputError(f"{path}:{lineno} needs string fields \"prompt\" and a non-empty "
                                 "\"reference\"")
        records.append((rec["prompt"], rec["reference"]))
    if not records:
        raise UserInputError(f"prompt suite '{path}' is empty; add lines like "
                             "{\"prompt\": \"...\", \"reference\": \"...\"}")
    return records


def load_suite(path: str | Path, tokenizer: Any, *, use_chat_template: bool | None = None) -> PromptSuite:
    """Read and tokenize a JSONL prompt suite.

    Args:
        path: JSONL file, one {"prompt", "reference"} object per line (other keys ignored).
        tokenizer: the model's HF tokenizer.
        use_chat_template: wrap prompts in the chat template; ``None`` = when the tokenizer has one.

    Raises:
        UserInputError: missing file or malformed lines.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserInputError(f"prompt suite '{path}' not found; pass a .jsonl file")
    chat = bool(getattr(tokenizer, "chat_template", None)) if use_chat_template is None else use_chat_template
    items = []
    for prompt, reference in _read_records(p):
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                 tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            prompt_ids = tokenizer(prompt)["input_ids"]
            reference = reference if prompt[-1:].isspace() else " " + reference
        ref_ids = tokenizer(reference, add_special_tokens=False)["input_ids"]
        items.append(SuiteItem(tuple(prompt_ids), tuple(ref_ids)))
    h = hashlib.sha256(b"autoplan-suite-v1\0")
    for it in items:
        h.update(json.dumps([it.prompt_ids, it.reference_ids]).encode() + b"\n")
    return PromptSuite(tuple(items), h.hexdigest(), str(p))


def _eos_ids(model: nn.Module) -> list[int]:
    ids: set[int] = set()
    for cfg in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return sorted(ids)


def _padded(seqs: list[tuple[int, ...]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to one length (token 0 under a zero attention mask); left for generation."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, cols], mask[i, cols] = torch.tensor(s), 1
    return ids, mask


@torch.inference_mode()
def greedy_continuations(model: nn.Module, prompts: list[tuple[int, ...]], max_new_tokens: int,
                         *, batch_size: int = 8) -> tuple[tuple[int, ...], ...]:
    """Greedy tokens after each prompt, up to ``max_new_tokens``, cut after the first EOS."""
    from transformers import GenerationConfig

    eos = _eos_ids(model)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    out: list[tuple[int, ...]] = []
    for i in range(0, len(prompts), batch_size):
        ids, mask = _padded(prompts[i:i + batch_size], left=True)
        gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        for row in gen[:, ids.shape[1]:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            out.append(tuple(row[:cut]))
    return tuple(out)


def _continuation_logprobs(model: nn.Module, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]],
                           batch_size: int) -> list[torch.Tensor]:
    """Per (prompt, continuation): log-probs of the continuation's tokens ([len(cont)] each)."""
    out = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        # right padding: causal attention keeps real positions independent of the padding
        ids, mask = _padded([p + c for p, c in chunk], left=False)
        pick = torch.zeros_like(ids, dtype=torch.bool)
        for row, (p, c) in enumerate(chunk):
            pick[row, len(p) - 1:len(p) + len(c) - 1] = True  # the continuation's predictors
        lp = torch.log_softmax(selected_logits(model, ids, pick, attention_mask=mask), dim=-1)
        at = 0  # rows of lp: the picked positions, row by row
        for p, c in chunk:
            out.append(lp[at:at + len(c)])
            at += len(c)
    return out


@torch.inference_mode()
def score_suite(model: nn.Module, ref: SuiteReference | PromptSuite,
                greedy: tuple[tuple[int, ...], ...] | None = None, *, batch_size: int = 8) -> SuiteScore:
    """Score ``model`` on the suite against the original's greedy continuations."""
    suite = ref.suite if isinstance(ref, SuiteReference) else ref
    greedy = ref.greedy if isinstance(ref, SuiteReference) else greedy
    if greedy is None:
        raise TypeError("score_suite needs a SuiteReference or explicit greedy continuations")
    items = suite.items
    pairs = [(it.prompt_ids, it.reference_ids) for it in items]
    pairs += [(it.prompt_ids, cont) for it, cont in zip(items, greedy)]
    lps = _continuation_logprobs(model, pairs, batch_size)
    lls, agree = [], []
    for k, it in enumerate(items):
        lls.append(float(lps[k].gather(-1, torch.tensor(it.reference_ids)[:, None]).mean()))
        lg = lps[len(items) + k]
        agree.append(float((lg.argmax(-1) == torch.tensor(greedy[k])).float().mean()))
    n = len(items)
    return SuiteScore(100 * sum(math.exp(x) for x in lls) / n, 100 * sum(agree) / n, sum(lls) / n)


def suite_reference(model: nn.Module, suite: PromptSuite, *, max_new_tokens: int = 16) -> SuiteReference:
    """Greedy continuations of the original model and its own suite score (agreement 100)."""
    greedy = greedy_continuations(model, [it.prompt_ids for it in suite.items], max_new_tokens)
    return SuiteReference(suite, greedy, score_suite(model, suite, greedy))


__all__ = ["PromptSuite", "SuiteItem", "SuiteReference", "SuiteScore", "greedy_continuations",
           "load_suite", "score_suite", "suite_reference"]
