"""`autoplan apply`: `autoplan export` with the default format of the backend that drives the
plan's target (ONNX Runtime on CPU targets, compressed-tensors on GPUs). Thin over
``autoplan.export.apply``."""

from __future__ import annotations

import click

from autoplan.atomic import check_writable_dir
from autoplan.cli._export_options import (
    calibration_args,
    check_calibration_options,
    export_options,
    report,
)
from autoplan.cli._output import err_console, json_option


@click.command("apply")
@click.argument("plan_path", metavar="PLAN")
@click.option("--out", "out_dir", required=True, help="Folder to write (replaced atomically).")
@export_options
@json_option
def command(plan_path: str, out_dir: str, model: str | None, calibration: str | None,
            seq_len: int | None, n_calib: int | None, n_eval: int | None, seed: int | None,
            calib_batch: int | None, allow_model_mismatch: bool, recovered_file: str | None,
            as_json: bool) -> None:
    """Apply PLAN to the model and write the runnable artifact to --out."""
    # the arguments and the plan file first, before the export stack (torch) is imported
    check_calibration_options(seq_len, n_calib, n_eval, seed, calib_batch)
    check_writable_dir(out_dir)
    from autoplan.plan.io import read_plan

    plan = read_plan(plan_path)
    from autoplan.export.apply import (
        apply_format,
        apply_plan,
        load_checked,
        plan_model_arg,
        recovered_weights,
        runtime_note,
    )
    from autoplan.export.calibration import plan_calibration
    from autoplan.export.preflight import check_export

    args = calibration_args(calibration, seq_len, n_calib, n_eval, seed, calib_batch)
    fmt = apply_format(plan)  # refuse before spending time loading the model
    name = plan_model_arg(plan.model_id, model)
    check_export(plan.full, fmt, name, out_dir, args)  # all that can be refused before loading
    note = runtime_note(plan, fmt)
    if note:
        err_console.print(f"note: {note}")
    err_console.print(f"loading {name} ...")
    loaded = load_checked(name)
    batches, recovered = None, None
    if plan.full is not None:
        recovered = recovered_weights(plan.full, plan_path, recovered_file)
        batches = plan_calibration(plan.full, loaded, args)
    out = apply_plan(loaded, plan, out_dir, calibration=batches,
                     allow_model_mismatch=allow_model_mismatch, recovered=recovered)
    report(out, fmt, len(plan.decisions), as_json)


__all__ = ["command"]
