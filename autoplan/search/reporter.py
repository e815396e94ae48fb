"""Where a search reports progress: the CLI subclasses `Reporter` with rich bars."""

from __future__ import annotations


class Reporter:
    """Progress sink; every method is a no-op here."""

    def stage(self, name: str) -> None: ...

    def progress(self, task: str, done: int, total: int) -> None: ...

    def note(self, text: str) -> None: ...


class Prefixed(Reporter):
    """Stages and notes of one platform of several, prefixed with its name."""

    def __init__(self, inner: Reporter, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def stage(self, name: str) -> None:
        self.inner.stage(f"{self.prefix}: {name}")

    def progress(self, task: str, done: int, total: int) -> None:
        self.inner.progress(task, done, total)

    def note(self, text: str) -> None:
        self.inner.note(f"{self.prefix}: {text}")


__all__ = ["Prefixed", "Reporter"]
