"""Error hierarchy. The library raises these; only the CLI turns them into exit codes.

`UserInputError` (exit 2) means the user asked for something invalid and the message names
the fix; `AutoplanError` (exit 1) is a runtime failure. No `assert` is used for input checks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AutoplanError(Exception):
    """Base class for every error autoplan raises on purpose (CLI exit code 1)."""

    exit_code = 1


class UserInputError(AutoplanError):
    """Bad input from the user: a usage error (CLI exit code 2)."""

    exit_code = 2


class UnknownNameError(UserInputError, KeyError):
    """A name looked up in a registry or catalog does not exist."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.4)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        self.kind, self.name, self.known = kind, name, known
        super().__init__(f"unknown {kind} '{name}'.{hint} Known: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class ModelConfigError(UserInputError):
    """A model config is malformed or describes an architecture autoplan does not support."""


class UnsupportedFormatError(UserInputError):
    """A (sparsity, precision) choice the target or runtime cannot accelerate."""


class PlanError(UserInputError):
    """A plan file is malformed, or was written by a newer autoplan."""
