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
    for col in ("point", "sample", "source", "metric", "published", "predicted", "error",
                "held-out family error", "settings"):
        table.add_column(col, overflow="fold",
                         justify="right" if col in ("published", "predicted", "error") else "left")
    for p in report.points:
        sample = "in" if p.tuned else "out"
        if p.predicted is None:
            table.add_row(p.id, sample, p.source, p.metric, f"{p.published:.3f}", "-", "-", "-",
                          p.detail)
            continue
        err = p.error or 0.0
        color = "green" if abs(err) <= 0.15 else "yellow" if abs(err) <= 0.30 else "red"
        held = ", ".join(f"{f} {e:+.1%}" for f, e in p.lofo_errors().items()) or "-"
        table.add_row(p.id, sample, p.source, p.metric, f"{p.published:.3f}",
                      f"{p.predicted:.3f}", f"[{color}]{err:+.1%}[/{color}]", held, p.detail)
    console.print(table)
    doc = report.to_json()
    console.print(f"MAPE of predicted speedup ratios: {report.mape:.1%} over {doc['evaluated']} "
                  f"points; in sample {report.mape_in_sample:.1%} ({doc['in_sample']} points the "
                  f"constants were set with), out of sample {report.mape_out_of_sample:.1%} "
                  f"({doc['out_of_sample']} added later); leave-one-family-out "
                  f"{report.mape_lofo:.1%} (" + ", ".join(
                      f"{f} {m:.1%}" for f, m in report.lofo_by_family().items()) + ")")
    if doc["moe"]:
        console.print(f"mixture-of-experts points: {report.mape_moe:.1%} over {doc['moe']} "
                      "(out of sample)")
