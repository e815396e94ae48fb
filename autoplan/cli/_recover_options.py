"""Recovery options `autoplan search --recover` and `autoplan recover` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from autoplan.recover.settings import RecoveryMethod, RecoverySettings

_DEFAULTS = RecoverySettings()

_OPTIONS = (
    click.option("--recover-steps", type=int, default=_DEFAULTS.steps, show_default=True,
                 help="Recovery optimizer steps."),
    click.option("--recover-lr", type=float, default=_DEFAULTS.lr, show_default=True,
                 help="Peak learning rate (AdamW, warmup then cosine)."),
    click.option("--recover-rank", type=int, default=_DEFAULTS.rank, show_default=True,
                 help="LoRA rank (--recover lora)."),
    click.option("--recover-text", default=None,
                 help="Training text (.txt/.jsonl; its calibration split); default pydoc."),
    click.option("--recover-batch", type=int, default=_DEFAULTS.batch, show_default=True,
                 help="Blocks per step."),
    click.option("--recover-seq-len", type=int, default=_DEFAULTS.seq_len, show_default=True,
                 help="Tokens per training block."),
    click.option("--recover-seed", type=int, default=_DEFAULTS.seed, show_default=True,
                 help="Block order and LoRA initialization."),
)


def recover_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def method_option(default: str | None) -> Callable[..., Any]:
    return click.option("--recover", "recover_method", default=default,
                        type=click.Choice(RecoveryMethod.values()),
                        help="After pruning and quantization, train towards the original "
                             "model: distill (the weights under their masks) or lora "
                             "(adapters, merged under the mask).")


def recovery_settings(method: str | None, steps: int, lr: float, rank: int, text: str | None,
                      batch: int, seq_len: int, seed: int) -> RecoverySettings | None:
    """The recovery settings, or None without --recover; a missing --recover-text file is
    refused here, before the model loads."""
    if method is None:
        return None
    from autoplan.quality.text import check_text_source

    check_text_source(text, "--recover-text")
    return RecoverySettings(method=method, steps=steps, lr=lr, rank=rank, text=text,
                            batch=batch, seq_len=seq_len, seed=seed)


__all__ = ["method_option", "recover_options", "recovery_settings"]
