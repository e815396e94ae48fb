"""Shared output helpers: JSON to stdout for scripts, rich to stdout for people,
diagnostics to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout (sorted keys, stable for diffs)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def json_option(f):
    import click

    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(f)


__all__ = ["console", "emit_json", "err_console", "json_option"]
