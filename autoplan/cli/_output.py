"""Shared output helpers: JSON to stdout for scripts, rich to stdout for people,
diagnostics to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console, ConsoleDimensions

# Width of tables written to a file or a pipe: rich would otherwise take the terminal's width
# (or 80 columns) and wrap cells mid-word, so `autoplan targets > f` split "alia/ses". Tables
# are as wide as their content, never padded to this.
FILE_WIDTH = 4096


class _Console(Console):
    """A rich Console that renders at FILE_WIDTH when its stream is not a terminal.

    A terminal keeps its own width; only a width passed here is kept for files too (rich's
    COLUMNS, often the terminal's, would wrap a file at the terminal's width again). The
    stream is judged at each render, so one swapped after import (click's CliRunner, a
    redirected sys.stdout) is judged as it is then.
    """

    def __init__(self, *args: Any, width: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, width=width, **kwargs)
        self._fixed_width = width is not None

    @property
    def size(self) -> ConsoleDimensions:
        if not self._fixed_width and not self.is_terminal:
            return ConsoleDimensions(FILE_WIDTH, self._height or 25)
        return super().size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size
        self._fixed_width = True


console = _Console()
err_console = _Console(stderr=True)


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout (sorted keys, stable for diffs)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def json_option(f):
    import click

    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(f)


__all__ = ["FILE_WIDTH", "console", "emit_json", "err_console", "json_option"]
