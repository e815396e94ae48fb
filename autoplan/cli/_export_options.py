"""Options `autoplan export` and `autoplan apply` share (apply is export with the default
format of the plan's backend), and the output line both print."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autoplan.cli._args import positive_int, seed_in_range
from autoplan.cli._output import console, emit_json
from autoplan.errors import UnknownNameError, UserInputError
from autoplan.registry import Registry

if TYPE_CHECKING:
    from autoplan.export.calibration import CalibrationArgs

_OPTIONS = (
    click.option("--model", default=None,
                 help="Model: alias, HF folder or GGUF (default: the plan's, when it is an alias)."),
    click.option("--calibration", default=None,
                 help="Calibration text the search used: pydoc, a .txt or .jsonl file (default: "
                      "the plan's when it is pydoc; a file is read only when passed here)."),
    click.option("--seq-len", type=int, default=None, help="Default: the plan's audit."),
    click.option("--n-calib", type=int, default=None, help="Default: the plan's audit."),
    click.option("--n-eval", type=int, default=None, help="Default: the plan's audit."),
    click.option("--seed", type=int, default=None, help="Default: the plan's audit."),
    click.option("--calib-batch", type=int, default=None,
                 help="Calibration blocks per forward pass (default: the plan's audit)."),
    click.option("--allow-model-mismatch", is_flag=True,
                 help="Write even if the model's content hash differs from the plan's."),
    click.option("--recovered", "recovered_file", default=None,
                 help="A recovered plan's weights (default: the file the plan names, beside it)."),
)


def export_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared options to a command."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


# The formats autoplan.export registers (test_cli_startup checks they are its names), so an
# unknown --format is refused before the export stack (torch) is imported.
EXPORT_FORMATS = ("compressed-tensors", "modelopt", "onnx", "gguf")


def check_export_format(fmt: str) -> None:
    """Refuse a --format no built-in exporter writes, with the registry's own message.

    Raises:
        UnknownNameError: lists the formats.
    """
    if Registry.key(fmt) not in EXPORT_FORMATS:
        raise UnknownNameError("export format", fmt, EXPORT_FORMATS)


def check_calibration_options(seq_len: int | None, n_calib: int | None, n_eval: int | None,
                              seed: int | None, calib_batch: int | None) -> None:
    """The calibration numbers, checked before anything is imported or loaded."""
    if seq_len is not None and seq_len < 2:  # a block predicts its tokens from earlier ones
        raise UserInputError(f"--seq-len must be >= 2, got {seq_len}")
    positive_int("n-calib", n_calib)
    positive_int("calib-batch", calib_batch)
    if n_eval is not None and n_eval < 0:
        raise UserInputError(f"--n-eval must be >= 0, got {n_eval}")
    seed_in_range(seed)


def calibration_args(calibration: str | None, seq_len: int | None, n_calib: int | None,
                     n_eval: int | None, seed: int | None, calib_batch: int | None
                     ) -> CalibrationArgs:
    """The calibration options (checked with `check_calibration_options` first: this imports
    the export stack)."""
    from autoplan.export.calibration import CalibrationArgs

    check_calibration_options(seq_len, n_calib, n_eval, seed, calib_batch)
    return CalibrationArgs(calibration, seq_len, n_calib, n_eval, seed, calib_batch)


def report(out: Path, fmt: str, layers: int, as_json: bool) -> None:
    """The one line (or JSON object) export and apply print."""
    if as_json:
        emit_json({"out": str(out), "format": fmt, "layers": layers})
        return
    sidecars = "autoplan_export.json holds the per-tensor sha256 audit, autoplan_plan.json the plan"
    if fmt == "onnx":
        sidecars = "manifest.json holds the per-tensor sha256 audit"
    if out.is_file():  # a single-file GGUF: its sidecars carry its name
        from autoplan.export.gguf import sidecar_paths

        plan_file, audit_file = sidecar_paths(out)
        sidecars = (f"{audit_file.name} holds the per-tensor sha256 audit, {plan_file.name} "
                    "the plan")
    console.print(f"wrote {out} ({fmt}, {layers} layers); {sidecars}")


__all__ = ["EXPORT_FORMATS", "calibration_args", "check_calibration_options",
           "check_export_format", "export_options", "report"]
