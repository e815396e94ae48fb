"""Where a search reports progress: the CLI subclasses `Reporter` with rich bars."""

from __future__ import annotations


class Reporter:
    """Progress sink; every method is a no-op here."""

    def stage(self, name: str) -> None: ...

    def progress(self, task: str, done: int, total: int) -> None: ...

    def note(self, text: str) -> None: ...


__all__ = ["Reporter"]
