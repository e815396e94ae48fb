"""`autoplan show plan.json`: render a plan file."""

from __future__ import annotations

import click

from autoplan.cli._output import console, emit_json
from autoplan.cli._plan_view import render
from autoplan.plan.io import load_plan


@click.command("show")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the validated plan as JSON.")
@click.option("--layers", is_flag=True, help="List every layer's decision.")
def command(plan_file: str, as_json: bool, layers: bool) -> None:
    """Show a plan: predicted speed vs baseline, measured quality, search certificate."""
    plan = load_plan(plan_file)
    if as_json:
        emit_json(plan.model_dump(mode="json"))
        return
    console.print(render(plan))
    if layers:
        for name, choice in sorted(plan.decisions.items()):
            console.print(f"{name:48s} {choice}")
