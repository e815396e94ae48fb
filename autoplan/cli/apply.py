"""`autoplan apply`: write a runnable artifact for a plan. CPU targets: an ONNX Runtime model
with the plan and its audit (manifest with the sha256 of every weight and scale tensor)."""

from __future__ import annotations

import click

from autoplan.bench import apply_plan_cpu, check_cpu_plan, read_plan
from autoplan.cli._output import console, emit_json, err_console, json_option
from autoplan.errors import UserInputError


def _plan_calibration(plan, loaded):
    """The plan's calibration batches, rebuilt from the settings its audit records, when its
    weights depend on them (GPTQ, Wanda/SparseGPT masks); None otherwise."""
    from autoplan.cli.export import _calibration
    from autoplan.export import needs_calibration

    full = plan.full
    if full is None or not needs_calibration(full):
        return None
    cal = full.audit.calibration
    if cal is None:
        raise UserInputError("this plan's weights depend on calibration data but it does not "
                             "record how it was drawn: use `autoplan export PLAN --format onnx` "
                             "with the search's --seq-len/--n-calib/--n-eval/--seed")
    err_console.print("rebuilding the plan's calibration set ...")
    try:
        return _calibration(full, loaded, None, cal.seq_len, cal.n_calib, cal.n_eval, cal.seed,
                            cal.batch_size)
    except UserInputError:
        raise UserInputError(
            f"the calibration text '{full.audit.calibration_source}' no longer hashes to the "
            "plan's audit (changed file?): run `autoplan export PLAN --format onnx "
            "--calibration FILE ...` with the text the search used") from None


@click.command("apply")
@click.argument("plan_path", metavar="PLAN")
@click.option("--model", default=None,
              help="Model: alias, HF folder or GGUF (default: the plan's).")
@click.option("--out", "out_dir", required=True, help="Folder to write (replaced atomically).")
@json_option
def command(plan_path: str, model: str | None, out_dir: str, as_json: bool) -> None:
    """Apply PLAN to the model and write the runnable artifact to --out."""
    from autoplan.models import load_model

    plan = read_plan(plan_path)
    check_cpu_plan(plan)  # refuse before spending time loading the model
    model = model or plan.model_id
    if not model:
        raise UserInputError("this plan does not name its model: pass --model")
    err_console.print(f"loading {model} ...")
    loaded = load_model(model)
    batches = _plan_calibration(plan, loaded)
    art = apply_plan_cpu(loaded, plan, out_dir, calibration=batches)
    counts: dict[str, int] = {}
    for layer in art.manifest["layers"].values():
        counts[layer["op_type"]] = counts.get(layer["op_type"], 0) + 1
    if as_json:
        emit_json({"out": str(art.path), "model": str(art.model_path), "ops": counts,
                   "weight_bytes": art.manifest["weight_bytes"]})
        return
    ops = ", ".join(f"{n} as {op}" for op, n in sorted(counts.items()))
    console.print(f"wrote {art.path}: layers {ops}; weights {art.manifest['weight_bytes'] / 1e6:,.1f} MB; "
                  "manifest.json holds the per-tensor sha256 audit")


__all__ = ["command"]
