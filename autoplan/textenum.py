"""TextEnum: a ``str`` Enum for user-facing vocabularies, defined once, read from user text.

Each vocabulary (pruning scores, quantization methods, ...) is one ``TextEnum`` subclass;
``click.Choice(Enum.values())`` and the library's own checks read the same members, so the
list is written in exactly one place.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from autoplan.errors import UserInputError

E = TypeVar("E", bound="TextEnum")


class TextEnum(str, Enum):
    """A str Enum whose members compare equal to their text (``QuantMethod.RTN == "rtn"``)."""

    # what the values are, for error messages ("quantization method")
    __noun__ = "value"

    @classmethod
    def values(cls) -> list[str]:
        """Every member's text, in definition order (for click.Choice)."""
        return [m.value for m in cls]

    @classmethod
    def parse(cls: type[E], text: E | str) -> E:
        """The member named by ``text`` (case-insensitive).

        Raises:
            UserInputError: unknown text; the message lists the valid values.
        """
        if isinstance(text, cls):
            return text
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise UserInputError(f"unknown {cls.__noun__} '{text}': use one of "
                                 f"{', '.join(cls.values())}") from None

    def __str__(self) -> str:
        return self.value


__all__ = ["TextEnum"]
