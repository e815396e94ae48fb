"""One registry for everything looked up by name (formats, backends, exporters, engines,
measured targets, model aliases): each name registered once, a lookup of an unknown name
listing the registered ones (compressed-tensors' RegistryMixin, as one generic class)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from autoplan.errors import AutoplanError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Items by name (case-insensitive, surrounding blanks ignored), in registration order.

    Args:
        kind: what an item is, for messages ("format", "backend", ...).
        fix: what to do instead of registering a name twice, appended to that error.
    """

    def __init__(self, kind: str, fix: str = "") -> None:
        self.kind, self.fix = kind, fix
        self.entries: dict[str, T] = {}

    @staticmethod
    def key(name: str) -> str:
        return name.strip().lower()

    def register(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``; returns it.

        Raises:
            AutoplanError: the name is taken (a second definition, a programming error).
        """
        key = self.key(name)
        if key in self.entries:
            raise AutoplanError(f"{self.kind} '{name}' is registered twice"
                                + (f": {self.fix}" if self.fix else ""))
        self.entries[key] = item
        return item

    def find(self, name: str) -> T | None:
        """The item under ``name``, or None."""
        return self.entries.get(self.key(name))

    def get(self, name: str) -> T:
        """The item under ``name``.

        Raises:
            UnknownNameError: no such name; the message lists the registered ones.
        """
        item = self.find(name)
        if item is None:
            raise UnknownNameError(self.kind, name, self.entries)
        return item

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self.entries)

    def values(self) -> list[T]:
        """Every item, in registration order."""
        return list(self.entries.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.key(name) in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


__all__ = ["Registry"]
