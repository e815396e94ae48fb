"""A tiny Llama model and character tokenizer, built in-process for unit tests (no downloads)."""

from __future__ import annotations

import string
from pathlib import Path

import torch

VOCAB = 128


def tiny_tokenizer():
    """Character-level fast tokenizer over printable ASCII (unknown characters -> [UNK])."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable))
    vocab = {"[UNK]": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="</s>")


def tiny_model(seed: int = 0):
    """A 2-layer LlamaForCausalLM (hidden 64, GQA 4/2 heads, tied embeddings), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                      max_position_embeddings=512, tie_word_embeddings=True,
                      eos_token_id=1, bos_token_id=1, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def save_tiny(folder: Path, seed: int = 0) -> Path:
    """Save the tiny model (safetensors) and its tokenizer into ``folder``."""
    tiny_model(seed).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder
