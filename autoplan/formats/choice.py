"""A layer's Choice: a (Sparsity, Precision) pair, and the sparsity patterns.

Canonical text forms (used in search spaces, plans and the CLI):
    precision:  any registered format (autoplan.formats.registry.Precision), e.g. fp8_e4m3
    sparsity:   dense | 2:4 (any N:M) | unstructured@50 | block32@50 | channel@25   (@ = percent zeroed)
    choice:     "2:4+fp8_e4m3"  (also accepted: "2:4 × fp8_e4m3", "2:4 x fp8_e4m3")
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autoplan.errors import UserInputError
from autoplan.formats.registry import Precision

_SPARSITY_RE = re.compile(
    r"^(?:(?P<dense>dense)"
    r"|(?P<n>\d+):(?P<m>\d+)"
    r"|(?P<kind>unstructured|block(?P<block>\d+)|channel)@(?P<pct>\d+(?:\.\d+)?)%?)$"
)


@dataclass(frozen=True, order=True)
class Sparsity:
    """A pruning pattern. `ratio` is the fraction of weights removed (0..1)."""

    kind: str = "dense"  # dense | nm | unstructured | block | channel
    n: int = 0
    m: int = 0
    block: int = 0
    ratio: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Sparsity:
        t = text.strip().lower().replace(" ", "")
        match = _SPARSITY_RE.match(t)
        if not match:
            raise UserInputError(
                f"cannot read sparsity '{text}': use dense, N:M (e.g. 2:4), unstructured@50, "
                "block32@50 or channel@25 (@ = percent of weights removed)"
            )
        if match["dense"]:
            return cls()
        if match["n"]:
            n, m = int(match["n"]), int(match["m"])
            if not 0 < n < m:
                raise UserInputError(f"N:M sparsity needs 0 < N < M, got '{text}'")
            return cls("nm", n=n, m=m, ratio=1 - n / m)
        ratio = float(match["pct"]) / 100
        if not 0 < ratio < 1:
            raise UserInputError(f"sparsity ratio must be between 0 and 100 percent, got '{text}'")
        if match["block"]:
            block = int(match["block"])
            if block not in (16, 32, 64):
                raise UserInputError(f"block size must be 16, 32 or 64, got {block}")
            return cls("block", block=block, ratio=ratio)
        return cls(match["kind"], ratio=ratio)

    def __str__(self) -> str:
        pct = f"{self.ratio * 100:g}"
        return {
            "dense": "dense",
            "nm": f"{self.n}:{self.m}",
            "unstructured": f"unstructured@{pct}",
            "block": f"block{self.block}@{pct}",
            "channel": f"channel@{pct}",
        }[self.kind]

    @property
    def density(self) -> float:
        """Fraction of the original weights that remain."""
        return 1.0 - self.ratio

    @property
    def index_bits_per_weight(self) -> float:
        """Index metadata per *original* weight position in the accelerated storage format.

        N:M keeps ceil(log2 M) bits per kept value (2:4 -> two 2-bit indices per 4 weights,
        hw-facts §3.6); block-sparse (BSR) keeps one int32 column index per kept block; an
        unstructured mask costs one bit per weight (bitmask); channel pruning shrinks the
        layer and needs no index.
        """
        if self.kind == "nm":
            return self.density * math.ceil(math.log2(self.m))
        if self.kind == "block":
            return self.density * 32 / (self.block * self.block)
        if self.kind == "unstructured":
            return 1.0
        return 0.0


DENSE = Sparsity()


@dataclass(frozen=True, order=True)
class Choice:
    """One layer's decision: sparsity pattern x precision."""

    sparsity: Sparsity
    precision: Precision

    @classmethod
    def parse(cls, text: str) -> Choice:
        parts = re.split(r"\s*(?:\+|×|\s[xX]\s)\s*", text.strip())
        if len(parts) == 1:
            return cls(DENSE, Precision.parse(parts[0]))
        if len(parts) != 2:
            raise UserInputError(
                f"cannot read choice '{text}': write SPARSITY+PRECISION, e.g. 2:4+fp8_e4m3"
            )
        return cls(Sparsity.parse(parts[0]), Precision.parse(parts[1]))

    def __str__(self) -> str:
        return f"{self.sparsity}+{self.precision.value}"

    def bits_per_weight(self) -> float:
        """Stored bits per original weight, counting scales and sparse index metadata."""
        return self.sparsity.density * self.precision.info.weight_bits + (
            self.sparsity.index_bits_per_weight
        )


def parse_choices(texts: tuple[str | Choice, ...] | None) -> tuple[Choice, ...] | None:
    """`--choices` as distinct Choices in the given order (None: the platform's space).
    Light (no torch): the CLI checks the option with it before importing the search stack."""
    if texts is None:
        return None
    choices = tuple(dict.fromkeys(c if isinstance(c, Choice) else Choice.parse(c) for c in texts))
    if not choices:
        raise UserInputError("--choices is empty: list formats, e.g. int4a8_g32,int8a8_g128")
    return choices


__all__ = ["DENSE", "Choice", "Sparsity", "parse_choices"]
