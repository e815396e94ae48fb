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

# Each command's module and the one line `autoplan --help` shows for it (its docstring's
# first sentence; tests/unit/test_cli_startup.py keeps the two equal). The module is imported
# only when its command runs or shows its own help (click's lazy-group pattern: parse first,
# work later), so `--help` and a usage error never import torch or the rest of the stack.
COMMANDS = {
    "targets": "List the hardware catalog and the targets measured on this machine (`local`: "
               "probed now, or read from its cache; `autoplan probe --refresh` measures again).",
    "probe": "Probe every backend (NVIDIA, AMD, CPU); unavailable ones say why.",
    "estimate": "Predict speed, memory, energy and $/1M tokens of one choice for every linear "
                "layer (and a KV-cache format with --kv-cache) against the uncompressed "
                "baseline.",
    "validate": "Compare predicted and published speedup ratios "
                "(autoplan/data/measurements.toml).",
    "profile": "Profile every layer x choice (cached on disk, resumable) and show the table.",
    "search": "Search per-layer sparsity x precision under a quality budget; write an "
              "auditable plan.",
    "compare": "Plan one model under one budget for several targets; rank them in one table.",
    "show": "Show a plan: predicted speed vs baseline, measured quality, search certificate.",
    "worker": "Take trial batches and candidate measurements of a running search until it is "
              "done.",
    "apply": "Apply PLAN to the model and write the runnable artifact to --out.",
    "export": "Export PLAN applied to its model as --format into --out.",
    "bench": "Measure prefill/decode tok/s, TTFT, TPOT and memory: baseline vs plan, one run.",
    "fleet": "Size a fleet for a plan and its baseline on one node type, showing the "
             "arithmetic.",
    "report": "Plot a plan (PLAN.json) or a compare folder into one self-contained HTML file.",
    "engines": "Serving engines autoplan checks exports against, each in its own venv.",
    "recover": "Train PLAN's compressed layers towards the original model; write the "
               "recovered plan.",
}


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
    """The command group: commands imported on first use (COMMANDS), errors as one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: D102
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: D102
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module = importlib.import_module(f"autoplan.cli.{cmd_name}")
            self.add_command(module.command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from COMMANDS alone: listing them imports none."""
        names = self.list_commands(ctx)
        width = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, _short(COMMANDS.get(n) or self.get_command(ctx, n).help or "", width))
                for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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
        except RecursionError:  # Python's JSON reader on thousands of nested brackets
            click.echo("error: an input is nested too deeply to read (Python's recursion "
                       "limit): check the JSON files passed", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autoplan")
def cli() -> None:
    """autoplan: choose per-layer sparsity and precision for LLM inference on your hardware."""


def _short(text: str, width: int) -> str:
    """click's own one-line summary of a help text, cut to `width`."""
    return click.Command(None, help=text).get_short_help_str(width)


def main() -> None:
    """Console entry point."""
    cli.main(prog_name="autoplan")
    sys.exit(0)


__all__ = ["COMMANDS", "cli", "main"]
