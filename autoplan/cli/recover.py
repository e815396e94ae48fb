"""`autoplan recover plan.json`: a recovery pass on a finished plan, written as a new plan."""

from __future__ import annotations

from pathlib import Path

import click

from autoplan.cli._export_options import calibration_args
from autoplan.cli._output import console, emit_json, err_console, json_option
from autoplan.cli._plan_view import render
from autoplan.cli._progress import RichReporter
from autoplan.cli._recover_options import recover_options, recovery_settings
from autoplan.errors import UserInputError


@click.command("recover")
@click.argument("plan_path", metavar="PLAN")
@click.option("--method", "method", type=click.Choice(["distill", "lora"]), default="distill",
              show_default=True, help="distill (the weights under their masks) or lora.")
@recover_options
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Recovered plan to write (default: PLAN-recovered.json beside PLAN); its "
                   "weights go to OUT's stem + .recovered.safetensors.")
@click.option("--model", default=None, help="Model (default: the plan's, when it is an alias).")
@click.option("--calibration", default=None, help="The search's calibration text (default: "
                                                  "the plan's when it is pydoc).")
@click.option("--lm-eval-tasks", default=None, help="Folder of local lm-eval task YAML files.")
@click.option("--lm-eval-limit", type=int, default=None, help="Documents per lm-eval task.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@json_option
def command(plan_path: str, method: str, recover_steps: int, recover_lr: float,
            recover_rank: int, recover_text: str | None, recover_batch: int,
            recover_seq_len: int, recover_seed: int, out: Path | None, model: str | None,
            calibration: str | None, lm_eval_tasks: str | None, lm_eval_limit: int | None,
            quiet: bool, as_json: bool) -> None:
    """Train PLAN's compressed layers towards the original model; write the recovered plan."""
    settings = recovery_settings(method, recover_steps, recover_lr, recover_rank, recover_text,
                                 recover_batch, recover_seq_len, recover_seed)
    if lm_eval_limit is not None and lm_eval_limit < 1:  # SearchRequest's own check
        raise UserInputError(f"--lm-eval-limit must be at least 1, got {lm_eval_limit}")
    from autoplan.plan.io import load_plan
    from autoplan.search.writable import check_writable_file

    def check_out(path: Path) -> Path:
        return check_writable_file(path, "plan", "pass --out FILE in a writable folder")

    plan = load_plan(plan_path)  # the plan and a given --out: before the stack is imported
    if out is not None:
        check_out(out)
    from autoplan.export.apply import load_checked, plan_model_arg
    from autoplan.search import RecoverOptions, recover_plan
    from autoplan.search.recovery import default_out

    if out is None:
        out = check_out(default_out(plan_path))
    name = plan_model_arg(plan.model.id, model)
    err_console.print(f"loading {name} ...")
    loaded = load_checked(name)
    opts = RecoverOptions(settings, out, calibration_args(calibration, None, None, None, None,
                                                          None), lm_eval_tasks, lm_eval_limit)
    with RichReporter(quiet=quiet or as_json) as reporter:
        new = recover_plan(plan, loaded, opts, reporter)
    if as_json:
        emit_json(new.model_dump(mode="json"))
        return
    if not quiet:
        console.print(render(new))
    err_console.print(f"recovered plan written to {out}")


__all__ = ["command"]
