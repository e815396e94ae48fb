"""KL per slice: numbers, proper names and non-English text, measured separately.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import gettext
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoplan.models.head import selected_logits
from autoplan.quality.metrics import kl_sum

SLICES = ("numbers", "names", "non-english")
LANGUAGES = ("de", "fr", "es", "it", "pt", "nl", "pl", "ru", "tr", "zh_CN", "ja", "ar")
SEED = 0
ROUNDS = 8  # lists of 6 names per language and round


@dataclass(frozen=True)
class Slice:
    name: str
    tokens: torch.Tensor = field(repr=False)  # int64 [n, seq_len]
    mask: torch.Tensor = field(repr=False)  # bool [n, seq_len]: position's next token in slice

    @property
    def positions(self) -> int:
        return int(self.mask.sum())


def _mask_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]]
                ) -> tuple[list[int], list[bool]]:
    """Token ids of ``text`` and, per token, whether it overlaps one of the char ``spans``."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    inside = []
    spans = sorted(spans)
    j = 0
    for start, end in offsets:
        while j < len(spans) and spans[j][1] <= start:
            j += 1
        inside.append(j < len(spans) and spans[j][0] < end and start < spans[j][1])
    return ids, inside


def _blocks(name: str, ids: list[int], inside: list[bool], seq_len: int, n: int) -> Slice:
    """The first ``n`` blocks; position t counts when token t+1 is in the slice."""
    need = n * seq_len
    if len(ids) < need:
        n = max(1, len(ids) // seq_len)
        need = n * seq_len
    tokens = torch.tensor(ids[:need], dtype=torch.long).reshape(n, seq_len)
    nxt = torch.tensor(inside[:need], dtype=torch.bool).reshape(n, seq_len)
    mask = torch.zeros_like(nxt)
    mask[:, :-1] = nxt[:, 1:]
    return Slice(name, tokens, mask)


def _numbers_text() -> str:
    from autoplan.quality.text import is_eval_document, load_documents

    docs, _ = load_documents(None)
    lines = [line.strip() for key, text in docs if is_eval_document(key)
             for line in text.splitlines()
             if sum(ch.isdigit() for ch in line) >= max(3, len(line) // 10)]
    return "\n".join(lines)


def _names_text(rng: random.Random) -> tuple[str, list[tuple[int, int]]]:
    import pycountry

    subs = sorted(pycountry.subdivisions, key=lambda s: s.code)
    rng.shuffle(subs)
    parts, spans, pos = [], [], 0
    for sub in subs[:600]:
        country = pycountry.countries.get(alpha_2=sub.country_code)
        if country is None:
            continue
        kind = sub.type.lower()
        article = "an" if kind[:1] in "aeiou" else "a"
        head = f"{sub.name} is {article} {kind} of "
        sentence = f"{head}{country.name}. "
        start = pos + len(head)
        spans += [(pos, pos + len(sub.name)), (start, start + len(country.name))]
        parts.append(sentence)
        pos += len(sentence)
    return "".join(parts), spans


def _non_english_text(rng: random.Random) -> tuple[str, list[tuple[int, int]]]:
    import pycountry

    countries = sorted(pycountry.countries, key=lambda c: c.alpha_2)
    catalogs = [gettext.translation("iso3166-1", pycountry.LOCALES_DIR, languages=[lang])
                for lang in LANGUAGES]
    parts, spans, pos = [], [], 0
    for _ in range(ROUNDS):  # languages interleaved, so every block holds several
        for tr in catalogs:
            picked = rng.sample(countries, 12)
            names = [n for n, c in ((tr.gettext(c.name), c) for c in picked) if n != c.name][:6]
            for i, n in enumerate(names):
                sep = ", " if i < len(names) - 1 else ".\n"
                spans.append((pos, pos + len(n)))
                parts.append(n + sep)
                pos += len(n) + len(sep)
    return "".join(parts), spans


@dataclass(frozen=True)
class SliceSet:
    slices: tuple[Slice, ...]
    content_hash: str


def build_slices(tokenizer: Any, *, seq_len: int = 128, n_blocks: int = 2) -> SliceSet:
    """The three default slices, ``n_blocks`` x ``seq_len`` tokens each."""
    rng = random.Random(SEED)
    out = []
    text = _numbers_text()
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    digit = {i: any(ch.isdigit() for ch in tokenizer.decode([i])) for i in set(ids)}
    out.append(_blocks("numbers", ids, [digit[i] for i in ids], seq_len, n_blocks))
    for name, (text, spans) in (("names", _names_text(rng)),
                                ("non-english", _non_english_text(rng))):
        ids, inside = _mask_spans(tokenizer, text, spans)
        out.append(_blocks(name, ids, inside, seq_len, n_blocks))
    h = hashlib.sha256(b"autoplan-slices-v1\0")
    for s in out:
        h.update(s.name.encode() + b"\0" + s.tokens.numpy().tobytes() + s.mask.numpy().tobytes())
    return SliceSet(tuple(out), h.hexdigest())


@dataclass(frozen=True)
class SliceReference:
    """The original model's log-probs at each slice's positions (fp16 [positions, vocab])."""

    slices: SliceSet = field(repr=False)
    logprobs: tuple[torch.Tensor, ...] = field(repr=False)


def _masked_logprobs(model: nn.Module, s: Slice) -> torch.Tensor:
    """Log-probs at the slice's positions only (the head never runs on the others)."""
    device = next(model.parameters()).device
    out = selected_logits(model, s.tokens.to(device), s.mask.to(device))
    return torch.log_softmax(out, dim=-1).cpu()


@torch.inference_mode()
def slice_reference(model: nn.Module, slices: SliceSet) -> SliceReference:
    return SliceReference(slices, tuple(_masked_logprobs(model, s).half() for s in slices.slices))


@torch.inference_mode()
def slice_kl(model: nn.Module, ref: SliceReference) -> dict[str, float]:
    """Mean KL(P_original || P_model) per slice, over the slice's positions (nats)."""
    out = {}
    for s, lp in zip(ref.slices.slices, ref.logprobs, strict=True):
        n = max(1, s.positions)
        out[s.name] = kl_sum(lp[None], _masked_logprobs(model, s)[None]) / n
    return out


__all__ = ["LANGUAGES", "SLICES", "Slice", "SliceReference", "SliceSet", "build_slices",
           "slice_kl", "slice_reference"]
