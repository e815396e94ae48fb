"""`autoplan export`: write a plan as a checkpoint a serving engine loads.

Thin over ``autoplan.export``: ``export_plan`` writes the format; ``plan_calibration``
rebuilds the plan's calibration blocks when its weights depend on them (they must hash to
the plan's audit, and the recomputed weights are checked against the plan's digests before
anything is written).
"""

from __future__ import annotations

import click

from autoplan.atomic import check_writable_dir
from autoplan.cli._export_options import (
    calibration_args,
    check_calibration_options,
    check_export_format,
    export_options,
    report,
)
from autoplan.cli._output import err_console, json_option


@click.command("export")
@click.argument("plan_path", metavar="PLAN")
@click.option("--format", "fmt", required=True,
              help="compressed-tensors (vLLM/SGLang), modelopt (TensorRT-LLM), onnx (CPU) or "
                   "gguf (llama.cpp).")
@click.option("--out", "out_dir", required=True,
              help="Folder to write (replaced atomically); for gguf also FILE.gguf.")
@export_options
@click.option("--lora-adapter", "adapter_dir", default=None,
              help="A plan recovered with --recover lora: write its PEFT adapter into this "
                   "folder and the base (--out) as it was before recovery, for engines that "
                   "serve adapters (default: the adapter merged into --out).")
@json_option
def command(plan_path: str, fmt: str, out_dir: str, model: str | None, calibration: str | None,
            seq_len: int | None, n_calib: int | None, n_eval: int | None, seed: int | None,
            calib_batch: int | None, allow_model_mismatch: bool, recovered_file: str | None,
            adapter_dir: str | None, as_json: bool) -> None:
    """Export PLAN applied to its model as --format into --out."""
    check_writable_dir(out_dir)  # the arguments first, before the export stack (torch)
    check_calibration_options(seq_len, n_calib, n_eval, seed, calib_batch)
    if adapter_dir is not None:
        check_writable_dir(adapter_dir, "--lora-adapter")
    check_export_format(fmt)
    from autoplan.quality.text import check_text_source

    check_text_source(calibration, "--calibration")  # a missing file (check_export again)
    from autoplan.export import export_plan, get_exporter
    from autoplan.export.apply import load_checked, plan_model_arg, recovered_weights
    from autoplan.export.calibration import plan_calibration
    from autoplan.export.preflight import check_export
    from autoplan.plan.io import load_plan

    args = calibration_args(calibration, seq_len, n_calib, n_eval, seed, calib_batch)
    get_exporter(fmt)  # refuse an unknown format before loading anything
    plan = load_plan(plan_path)
    if adapter_dir is not None and (plan.recovery is None or plan.recovery.method != "lora"):
        from autoplan.errors import UserInputError

        raise UserInputError("--lora-adapter needs a plan recovered with --recover lora")
    recovered = recovered_weights(plan, plan_path, recovered_file)
    name = plan_model_arg(plan.model.id, model)
    check_export(plan, fmt, name, out_dir, args)  # all that can be refused before loading
    err_console.print(f"loading {name} ...")
    loaded = load_checked(name)
    batches = plan_calibration(plan, loaded, args)
    out = export_plan(plan, loaded, fmt, out_dir, calibration=batches,
                      allow_model_mismatch=allow_model_mismatch, recovered=recovered,
                      unrecovered=adapter_dir is not None)
    if adapter_dir is not None:
        from autoplan.export.lora_adapter import write_lora_adapter

        write_lora_adapter(plan, loaded, recovered, adapter_dir)
        err_console.print(f"wrote the LoRA adapter to {adapter_dir} (PEFT); --out holds the "
                          "base before recovery")
    report(out, fmt, len(plan.decisions), as_json)


__all__ = ["command"]
