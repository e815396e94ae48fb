"""Calibration and evaluation text as token blocks, split deterministically, hashed for audits.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import UserInputError

if TYPE_CHECKING:  # imported where tensors are made: checking a path needs no torch
    import torch

SPLIT_SALT = b"autoplan-split-v1\0"
EVAL_EVERY = 5  # one document in five (by hash) is held out for evaluation


@dataclass(frozen=True)
class TextDataset:
    """Token blocks for calibration and evaluation.

    Attributes:
        calib: int64 tensor [n_calib, seq_len].
        eval: int64 tensor [n_eval, seq_len].
        content_hash: sha256 over seq_len and both tensors' token ids (for caches and plans).
        source: ``"pydoc"`` or the file path given.
    """

    calib: torch.Tensor = field(repr=False)
    eval: torch.Tensor = field(repr=False)
    content_hash: str
    source: str


def is_eval_document(key: str) -> bool:
    """The split rule: True when the document with this key belongs to evaluation."""
    digest = hashlib.sha256(SPLIT_SALT + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % EVAL_EVERY == 0


def _pydoc_documents() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(key, topics[key]) for key in sorted(topics)]


def _txt_documents(path: Path) -> list[tuple[str, str]]:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    paragraphs = [p.strip() for p in text.split("\n\n")]
    return [(p, p) for p in paragraphs if p]


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a JSONL file.

    Raises:
        UserInputError: a line is not valid JSON (the message names file and line).
    """
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError:
            raise UserInputError(f"{path}:{lineno} is not valid JSON; write one JSON object "
                                 "per line") from None


def _jsonl_documents(path: Path) -> list[tuple[str, str]]:
    docs = []
    for lineno, record in read_jsonl(path):
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UserInputError(f"{path}:{lineno} lacks a string field \"text\"; write lines "
                                 "like {\"text\": \"...\"}")
        text = record["text"].strip()
        if text:
            docs.append((text, text))
    return docs


def check_text_source(source: str | Path | None, flag: str | None = None) -> Path | None:
    """The file a text source names (None for pydoc topics), checked without reading it, so
    a missing or misnamed file is refused before a model is loaded. ``flag`` (e.g.
    ``--recover-text``) prefixes the message when the source came from that option.

    Raises:
        UserInputError: no such file, or a suffix other than .txt / .jsonl.
    """
    if source is None or str(source) == "pydoc":
        return None
    path = Path(source).expanduser()
    where = f"{flag}: " if flag else ""
    if not path.is_file():
        raise UserInputError(f"{where}text source '{source}' not found; pass a .txt or .jsonl "
                             "file")
    if path.suffix.lower() not in (".txt", ".jsonl"):
        raise UserInputError(f"{where}text source '{source}' must end in .txt or .jsonl")
    return path


def load_documents(source: str | Path | None) -> tuple[list[tuple[str, str]], str]:
    """(key, text) documents of a source and the source's name; ``None`` means pydoc topics.

    Raises:
        UserInputError: missing file, unknown suffix, malformed JSONL, or no text.
    """
    path = check_text_source(source)
    if path is None:
        return _pydoc_documents(), "pydoc"
    docs = _txt_documents(path) if path.suffix.lower() == ".txt" else _jsonl_documents(path)
    if not docs:
        raise UserInputError(f"text source '{source}' holds no text")
    return docs, str(path)


def _blocks(ids: list[int], seq_len: int, n: int, rng: random.Random, split: str) -> torch.Tensor:
    import torch

    available = len(ids) // seq_len
    if n > available:
        raise UserInputError(f"the {split} split has {available} blocks of {seq_len} tokens but "
                             f"{n} are needed; lower n_{split}/seq_len or supply more text")
    picks = sorted(rng.sample(range(available), n))
    return torch.tensor([ids[i * seq_len:(i + 1) * seq_len] for i in picks], dtype=torch.long
                        ).reshape(n, seq_len)


def load_text_dataset(source: str | Path | None = None, *, tokenizer: Any, seq_len: int = 256,
                      n_calib: int = 32, n_eval: int = 8, seed: int = 0) -> TextDataset:
    """Calibration and evaluation token blocks from pydoc topics or a user file.

    Args:
        source: ``None``/``"pydoc"`` for the built-in text, or a .txt/.jsonl path.
        tokenizer: an HF tokenizer (callable returning ``input_ids``).
        seq_len: tokens per block.
        n_calib: calibration blocks (may be 0).
        n_eval: evaluation blocks (may be 0).
        seed: picks which blocks of each split are used; the split itself never depends on it.

    Raises:
        UserInputError: bad sizes, bad source, or too little text for the requested blocks.
    """
    if seq_len < 2 or n_calib < 0 or n_eval < 0:
        raise UserInputError("seq_len must be >= 2 and n_calib/n_eval >= 0")
    docs, name = load_documents(source)
    rng = random.Random(seed)
    parts = {}
    for split, want_eval in (("calib", False), ("eval", True)):
        chosen = sorted((k, t) for k, t in docs if is_eval_document(k) == want_eval)
        text = "\n\n".join(t for _, t in chosen)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        parts[split] = _blocks(list(ids), seq_len, n_calib if split == "calib" else n_eval, rng, split)
    h = hashlib.sha256(f"autoplan-text-v1\0{seq_len}\0".encode())
    for split in ("calib", "eval"):
        h.update(split.encode() + b"\0" + parts[split].long().numpy().tobytes())
    return TextDataset(parts["calib"], parts["eval"], h.hexdigest(), name)


__all__ = ["TextDataset", "check_text_source", "is_eval_document", "load_documents",
           "load_text_dataset", "read_jsonl"]
