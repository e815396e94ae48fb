"""`autoplan show plan.json`: render a plan file."""

from __future__ import annotations

import click

from autoplan.cli._output import console, emit_json
from autoplan.cli._plan_view import render
from autoplan.errors import PlanError, UserInputError
from autoplan.formats import Choice
from autoplan.plan.io import load_plan


def _check_decisions(plan_file: str, decisions: dict[str, str]) -> None:
    """Refuse a plan whose decisions name a format this autoplan does not know, as export,
    apply and fleet do: rendering it would present a plan nothing can run."""
    for layer, text in sorted(decisions.items()):
        try:
            Choice.parse(text)
        except UserInputError as exc:
            raise PlanError(f"{plan_file}: layer '{layer}' has format '{text}': {exc}") from None


@click.command("show")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the validated plan as JSON.")
@click.option("--layers", is_flag=True, help="List every layer's decision.")
def command(plan_file: str, as_json: bool, layers: bool) -> None:
    """Show a plan: predicted speed vs baseline, measured quality, search certificate."""
    plan = load_plan(plan_file)
    _check_decisions(plan_file, plan.decisions)
    if as_json:
        emit_json(plan.model_dump(mode="json"))
        return
    console.print(render(plan))
    if layers:
        for name, choice in sorted(plan.decisions.items()):
            console.print(f"{name:48s} {choice}")
