"""How a recovery pass runs: method, steps, learning rate, rank, text, seed.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

from autoplan.errors import UserInputError
from autoplan.textenum import TextEnum


class RecoveryMethod(TextEnum):
    """What a recovery pass trains."""

    __noun__ = "recovery method"

    DISTILL = "distill"  # the compressed layers' own weights, under their masks
    LORA = "lora"  # low-rank adapters (PEFT) beside the frozen compressed weights


@dataclass(frozen=True)
class RecoverySettings:
    """A recovery pass: KL(original || compressed) distillation on calibration text.

    Attributes:
        method: distill (masked weights) or lora (adapters, merged under the mask).
        steps: optimizer steps.
        lr: peak learning rate (AdamW, linear warmup then cosine decay to 10 %).
        rank: LoRA rank (lora only); alpha is ``2 * rank``.
        text: training text: None/"pydoc" (the built-in text) or a .txt/.jsonl file; its
            calibration split is used, never the evaluation split.
        seq_len: tokens per training block.
        batch: blocks per step.
        seed: block order and LoRA initialization.
        warmup: warmup steps (at most a tenth of ``steps``).
        checkpoint_every: steps between resumable checkpoints (0: none).
        max_blocks: training blocks drawn from the text (the calibration split's first ones
            in the seeded order; fewer when the text is shorter).
    """

    method: RecoveryMethod = RecoveryMethod.DISTILL
    steps: int = 150
    lr: float = 1e-4
    rank: int = 16
    text: str | None = None
    seq_len: int = 256
    batch: int = 2
    seed: int = 0
    warmup: int = 10
    checkpoint_every: int = 25
    max_blocks: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", RecoveryMethod.parse(self.method))
        for name, low in (("steps", 1), ("rank", 1), ("seq_len", 8), ("batch", 1),
                          ("warmup", 0), ("checkpoint_every", 0), ("max_blocks", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise UserInputError(f"--recover-{name.replace('_', '-')} must be an integer "
                                     f">= {low}, got {value}")
        if not (math.isfinite(self.lr) and 0 < self.lr < 1):
            raise UserInputError(f"--recover-lr must be a number in (0, 1), got {self.lr}")
        if not 0 <= self.seed < 2**31:
            raise UserInputError(f"--recover-seed must be from 0 to 2^31-1, got {self.seed}")

    @property
    def alpha(self) -> float:
        return 2.0 * self.rank

    @property
    def warmup_steps(self) -> int:
        return min(self.warmup, self.steps // 10)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["method"] = self.method.value
        if self.method is not RecoveryMethod.LORA:
            d.pop("rank")
        return d

    def key(self) -> str:
        """A digest of everything that changes what the pass trains (not checkpoint_every)."""
        d = {k: v for k, v in self.to_dict().items() if k != "checkpoint_every"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


__all__ = ["RecoveryMethod", "RecoverySettings"]
