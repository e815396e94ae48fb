"""Command-line interface: a thin click layer over the library API.

Only this layer turns exceptions into exit codes: UserInputError -> 2 (usage, message names
the fix), AutoplanError -> 1. A user mistake never shows a traceback. Each command lives in
its own module under autoplan/cli/ and exposes `command`.
"""

from __future__ import annotations

import importlib
import sys

import click

from autoplan import __version__
from autoplan.errors import AutoplanError

# Order is the order `autoplan --help` lists them.
_COMMAND_MODULES = (
    "targets", "probe", "estimate", "validate", "profile", "search", "compare", "show",
    "worker", "apply", "export", "bench", "fleet", "report", "engines", "recover",
)


class _OneLineUsageError(click.UsageError):
    """A click usage error (unknown option, missing or invalid value) printed as one line
    with its --help hint, like autoplan's own errors, instead of click's three-line block."""

    def show(self, file=None) -> None:  # noqa: ANN001, D102
        hint = f" Try '{self.ctx.command_path} --help'." if self.ctx is not None else ""
        click.echo(f"error: {self.format_message()}{hint}", err=True)


def _one_line(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):  # prints the help on purpose
        return exc
    message = exc.format_message().strip()  # MissingParameter builds its message here
    return _OneLineUsageError(message if message.endswith((".", "?")) else f"{message}.",
                              exc.ctx)


class _Group(click.Group):
    def make_context(self, *args, **kwargs) -> click.Context:  # noqa: D102 - the group's own options
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context):  # noqa: D102
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a command's options, or an unknown command
            raise _one_line(exc) from None
        except AutoplanError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoplan")
def cli() -> None:
    """autoplan: choose per-layer sparsity and precision for LLM inference on your hardware."""


for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"autoplan.cli.{_name}")
    except ModuleNotFoundError as _exc:  # command not built yet in this checkout
        if _exc.name != f"autoplan.cli.{_name}":
            raise
        continue
    cli.add_command(_module.command)


def main() -> None:
    """Console entry point."""
    cli.main(prog_name="autoplan")
    sys.exit(0)


__all__ = ["cli", "main"]
