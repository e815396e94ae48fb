"""`autoplan export`: write a plan as a checkpoint a serving engine loads.

Thin over ``autoplan.export.export_plan``. When the plan's weights depend on calibration
data (Wanda/SparseGPT masks, GPTQ, NVFP4 activation scales) the calibration blocks are
rebuilt with ``autoplan.quality.text.load_text_dataset`` and must hash to the plan's
``audit.calibration_hash``; the recomputed weights are then checked against the plan's
audit digests before anything is written.
"""

from __future__ import annotations

import click

from autoplan.cli._output import console, emit_json, err_console, json_option
from autoplan.errors import UserInputError


def _calibration(plan, loaded, source: str | None, seq_len: int, n_calib: int, n_eval: int,
                 seed: int, batch: int):  # noqa: ANN001, ANN202
    """The plan's calibration batches, refused unless they hash to the plan's audit."""
    from autoplan.quality.text import load_text_dataset

    source = source or plan.audit.calibration_source
    ds = load_text_dataset(source, tokenizer=loaded.tokenizer, seq_len=seq_len,
                           n_calib=n_calib, n_eval=n_eval, seed=seed)
    if ds.content_hash != plan.audit.calibration_hash:
        raise UserInputError(
            f"calibration text '{source}' (seq_len {seq_len}, {n_calib} calib / {n_eval} eval "
            f"blocks, seed {seed}) does not hash to the plan's {plan.audit.calibration_hash[:12]}: "
            "pass the --calibration/--seq-len/--n-calib/--n-eval/--seed the search used")
    return list(ds.calib.split(batch))


@click.command("export")
@click.argument("plan_path", metavar="PLAN")
@click.option("--model", default=None, help="Model: alias, HF folder or GGUF (default: the plan's).")
@click.option("--format", "fmt", required=True,
              help="compressed-tensors (vLLM/SGLang), modelopt (TensorRT-LLM), onnx (CPU) or "
                   "gguf (llama.cpp).")
@click.option("--out", "out_dir", required=True,
              help="Folder to write (replaced atomically); for gguf also FILE.gguf.")
@click.option("--calibration", default=None,
              help="Calibration text: pydoc, a .txt or .jsonl file (default: the plan's).")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--n-calib", type=int, default=32, show_default=True)
@click.option("--n-eval", type=int, default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--calib-batch", type=int, default=8, show_default=True,
              help="Calibration blocks per forward pass when recomputing statistics.")
@click.option("--allow-model-mismatch", is_flag=True,
              help="Export even if the model's content hash differs from the plan's.")
@json_option
def command(plan_path: str, model: str | None, fmt: str, out_dir: str, calibration: str | None,
            seq_len: int, n_calib: int, n_eval: int, seed: int, calib_batch: int,
            allow_model_mismatch: bool, as_json: bool) -> None:
    """Export PLAN applied to its model as --format into --out."""
    from autoplan.export import export_plan, get_exporter, needs_calibration
    from autoplan.models import load_model
    from autoplan.plan.io import load_plan

    get_exporter(fmt)  # refuse an unknown format before loading anything
    if calib_batch < 1:
        raise UserInputError(f"--calib-batch must be a positive integer, got {calib_batch}")
    plan = load_plan(plan_path)
    name = model or plan.model.id
    err_console.print(f"loading {name} ...")
    loaded = load_model(name)
    batches = None
    if needs_calibration(plan):
        batches = _calibration(plan, loaded, calibration, seq_len, n_calib, n_eval, seed,
                               calib_batch)
    out = export_plan(plan, loaded, fmt, out_dir, calibration=batches,
                      allow_model_mismatch=allow_model_mismatch)
    if as_json:
        emit_json({"out": str(out), "format": fmt, "layers": len(plan.decisions)})
        return
    sidecars = "autoplan_export.json holds the per-tensor sha256 audit, autoplan_plan.json the plan"
    if out.is_file():  # a single-file GGUF: its sidecars carry its name
        from autoplan.export.gguf import sidecar_paths

        plan_file, audit_file = sidecar_paths(out)
        sidecars = (f"{audit_file.name} holds the per-tensor sha256 audit, {plan_file.name} "
                    "the plan")
    console.print(f"wrote {out} ({fmt}, {len(plan.decisions)} layers); {sidecars}")


__all__ = ["command"]
