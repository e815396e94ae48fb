"""Where profile scoring tasks run: in this process, or sharded over workers.

A scoring task is a pure function of tensors (one layer's weight, its captured inputs and
output gradients, the choices to score), so it can run anywhere: the profile builds tasks,
an executor runs them and yields each result as soon as it is done, and the profile writes
its cache after every result (so an interrupted or partly failed run resumes). The serial
executor is the default; a distributed one (Ray) implements the same two methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Runs `fn` over `items`, yielding `(index, result)` pairs in completion order."""

    name: str

    def imap_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R]]:
        ...

    def close(self) -> None:
        ...


class SerialExecutor:
    """Runs every task in this process, in order."""

    name = "serial"

    def imap_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R]]:
        for i, item in enumerate(items):
            yield i, fn(item)

    def close(self) -> None:
        return None


__all__ = ["Executor", "SerialExecutor"]
