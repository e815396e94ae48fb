"""Rich progress bars (with ETA) for long library calls, on stderr so --json stays clean."""

from __future__ import annotations

from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from autoplan.cli._output import err_console
from autoplan.search import Reporter


class RichReporter(Reporter):
    """One bar per task name (profile, trials, verify); stage lines between them."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._progress = Progress(
            TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=err_console, disable=quiet, transient=False)
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> RichReporter:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def stage(self, name: str) -> None:
        if not self.quiet:
            self._progress.console.print(f"[bold cyan]>[/] {name}")

    def progress(self, task: str, done: int, total: int) -> None:
        if total <= 0:  # nothing to do (e.g. a fully cached profile): show it as complete
            done = total = 1
        if task not in self._tasks:
            self._tasks[task] = self._progress.add_task(task, total=total)
        self._progress.update(self._tasks[task], completed=done, total=total)

    def note(self, text: str) -> None:
        if not self.quiet:
            self._progress.console.print(f"[yellow]note:[/] {text}")


__all__ = ["RichReporter"]
