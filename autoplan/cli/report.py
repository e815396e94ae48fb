"""`autoplan report`: one self-contained HTML file for a plan or a compare folder.
Thin over autoplan.report.write_report."""

from __future__ import annotations

from pathlib import Path

import click

from autoplan.cli._output import err_console


@click.command("report")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write (opens offline: plots embedded).")
@click.option("--model", default=None,
              help="The plan's model (folder, .gguf or config.json) for the per-layer cost "
                   "breakdown; refused when it is another model (default: the plan's model "
                   "id).")
def command(source: Path, out: Path, model: str | None) -> None:
    """Plot a plan (PLAN.json) or a compare folder into one self-contained HTML file."""
    from autoplan.report import write_report

    write_report(source, out, model)
    err_console.print(f"report written to {out}")


__all__ = ["command"]
