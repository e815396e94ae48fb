"""`autoplan validate`: the cost model's predicted speedups against published measurements."""

from __future__ import annotations

import click
from rich.table import Table

from autoplan.cli._output import console, emit_json, json_option
from autoplan.cost.validate import validate


@click.command("validate")
@json_option
def command(as_json: bool) -> None:
    """Compare predicted and published speedup ratios (autoplan/data/measurements.toml)."""
    report = validate()
    if as_json:
        emit_json(report.to_json())
        return
    table = Table(title="cost model vs published measurements (speedup ratios)")
    for col in ("point", "source", "metric", "published", "predicted", "error", "settings"):
        table.add_column(col, overflow="fold",
                         justify="right" if col in ("published", "predicted", "error") else "left")
    for p in report.points:
        if p.predicted is None:
            table.add_row(p.id, p.source, p.metric, f"{p.published:.3f}", "-", "-", p.detail)
            continue
        err = p.error or 0.0
        color = "green" if abs(err) <= 0.15 else "yellow" if abs(err) <= 0.30 else "red"
        table.add_row(p.id, p.source, p.metric, f"{p.published:.3f}", f"{p.predicted:.3f}",
                      f"[{color}]{err:+.1%}[/{color}]", p.detail)
    console.print(table)
    evaluated = sum(p.predicted is not None for p in report.points)
    console.print(f"MAPE of predicted speedup ratios: {report.mape:.1%} over {evaluated} points")
