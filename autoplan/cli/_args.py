"""Checks of numeric options shared by the commands, run before any work.

click's own ranges (``IntRange``) would print a usage block of several lines; these raise a
``UserInputError`` instead, which the CLI prints as one line and exits 2.
"""

from __future__ import annotations

import math

from autoplan.errors import UserInputError


def positive_int(flag: str, value: int | None) -> int | None:
    """``value`` if it is None or >= 1; else a one-line error naming ``--flag``."""
    if value is not None and value < 1:
        raise UserInputError(f"--{flag} must be a positive integer, got {value}")
    return value


def finite_positive(flag: str, value: float | None) -> float | None:
    """``value`` if it is None or a finite number > 0 (NaN and inf refused)."""
    if value is not None and not 0 < value < math.inf:
        raise UserInputError(f"--{flag} must be a finite number > 0, got {value}")
    return value


def seed_in_range(value: int | None) -> int | None:
    """``value`` if it is None or a seed every random generator autoplan seeds accepts (the
    range search checks), so a bad --seed fails before the model is loaded."""
    from autoplan.search.seeds import MAX_SEED

    if value is not None and not 0 <= value <= MAX_SEED:
        raise UserInputError(f"--seed must be an integer from 0 to {MAX_SEED}, got {value}")
    return value


def finite_non_negative(flag: str, value: float | None) -> float | None:
    """``value`` if it is None or a finite number >= 0 (NaN and inf refused)."""
    if value is not None and not 0 <= value < math.inf:
        raise UserInputError(f"--{flag} must be a finite number >= 0, got {value}")
    return value


__all__ = ["finite_non_negative", "finite_positive", "positive_int", "seed_in_range"]
