"""`autoplan validate`: the cost model's predicted speedups against published measurements,
or (--cost-table) its GEMM times against a measured cost table."""

from __future__ import annotations

import click
from rich.table import Table

from autoplan.cli._output import console, emit_json, json_option
from autoplan.cost.validate import validate


@click.command("validate")
@click.option("--cost-table", default=None,
              help="A measured cost table (cost_table.json from benchmarks/gpu_check.sh): "
                   "report the analytic GEMM time's error against it per kernel class.")
@click.option("--target", default=None,
              help="Catalog target the table was measured on (default: read from its device "
                   "name, e.g. 'NVIDIA H200' -> h200).")
@json_option
def command(cost_table: str | None, target: str | None, as_json: bool) -> None:
    """Compare predicted and published speedup ratios (autoplan/data/measurements.toml)."""
    if cost_table is not None:
        _cost_table(cost_table, target, as_json)
        return
    if target is not None:
        raise click.UsageError("--target applies to --cost-table only; pass both")
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


def _cost_table(path: str, target: str | None, as_json: bool) -> None:
    from autoplan.backends.registry import resolve_target
    from autoplan.cost.measured import load_cost_table
    from autoplan.cost.table_check import DISAGREE, check_cost_table

    doc = load_cost_table(path)
    name = target or _target_of_device(str(doc.get("device", "")))
    check = check_cost_table(doc, resolve_target(name))
    if as_json:
        emit_json(check.to_json())
        return
    table = Table(title=f"analytic GEMM time vs {path} ({check.device}) on {check.target}")
    for col in ("choice", "bound", "kernel", "rows", "MAPE", "mean error", "worst row"):
        table.add_column(col, justify="right" if col in ("rows", "MAPE", "mean error") else "left")
    for c in check.classes:
        color = "red" if c.disagrees else "green"
        w = c.worst
        table.add_row(c.choice, c.bound, ", ".join(c.kernels), str(c.rows),
                      f"[{color}]{c.mape:.1%}[/{color}]", f"{c.mean_error:+.1%}",
                      f"m={w.m} n={w.n} k={w.k}: {w.measured_s * 1e6:.1f} us measured, "
                      f"{w.predicted_s * 1e6:.1f} predicted")
    console.print(table)
    skipped = sum(1 for r in check.rows if r.predicted_s is None)
    flagged = [f"{c.choice} ({c.bound})" for c in check.classes if c.disagrees]
    console.print(f"MAPE of analytic GEMM times: {check.mape:.1%} over "
                  f"{len(check.rows) - skipped} rows" + (f" ({skipped} the target cannot run)"
                                                         if skipped else "")
                  + (f"; over {DISAGREE:.0%} (correction candidates): {', '.join(flagged)}"
                     if flagged else f"; every class within {DISAGREE:.0%}"))


def _target_of_device(device: str) -> str:
    """'NVIDIA H200' -> 'h200': the device name's model token, when the catalog knows it."""
    from autoplan.errors import UnknownNameError, UserInputError
    from autoplan.targets import get_target

    for token in device.lower().replace("nvidia", " ").replace("amd", " ").split():
        try:
            return get_target(token).name
        except UnknownNameError:
            continue
    raise UserInputError(f"cannot tell the target from the table's device '{device}'; pass "
                         "--target (autoplan targets lists them)")
