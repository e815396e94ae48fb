"""Checks `export`, `apply` and `bench` run before loading the model.

Everything they would otherwise refuse only after seconds to minutes of loading (and, for a
GGUF, converting) the model: a format whose runtime cannot serve the plan, a model whose files
are missing or damaged, a calibration text that must be passed, an --out folder that autoplan
did not write. Each refusal is one line naming the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from autoplan.atomic import check_writable_dir
from autoplan.backends.registry import resolve_target
from autoplan.errors import UserInputError
from autoplan.export import get_exporter
from autoplan.export._prepare import check_runtime, parse_decisions, pick_runtime
from autoplan.export._write import AUDIT_FILE
from autoplan.export.calibration import CalibrationArgs, check_calibration
from autoplan.plan.schema import Plan


def check_out(out_dir: str | os.PathLike[str], fmt: str) -> Path:
    """Refuse an --out the exporter would refuse only once it has written everything: one it
    cannot create, or an existing folder (or GGUF file) that is not an autoplan export.

    Raises:
        UserInputError: one line naming the flag and the fix.
    """
    from autoplan.backends.cpu.onnx_export import MANIFEST
    from autoplan.export.gguf import sidecar_paths

    out = check_writable_dir(out_dir)
    if not out.exists():
        return out
    if fmt == "gguf" and out.suffix.lower() == ".gguf":  # a single-file GGUF export
        ours = out.is_file() and sidecar_paths(out)[1].is_file()
    else:  # each exporter's own mark of a folder it wrote
        marker = MANIFEST if fmt == "onnx" else AUDIT_FILE
        ours = out.is_dir() and (not any(out.iterdir()) or (out / marker).is_file())
    if not ours:
        raise UserInputError(f"'{out}' exists and is not an autoplan export: choose a new --out "
                             "folder or remove it")
    return out


def check_export(plan: Plan | None, fmt: str, model: str, out_dir: str | os.PathLike[str],
                 calibration: CalibrationArgs | None = None) -> None:
    """Everything export (``plan`` full) or apply of a minimal plan (``plan`` None) can check
    before loading ``model``: the format's runtime against the plan, the calibration text,
    the model's files (headers only), a GGUF source for --format gguf, and --out.

    Raises:
        UserInputError: one line naming the fix.
    """
    from autoplan.export.gguf import check_gguf_source
    from autoplan.models import check_loadable

    if plan is not None:
        exporter = get_exporter(fmt)
        check_runtime(fmt, resolve_target(plan.target.name),
                      pick_runtime(plan, exporter.runtimes), parse_decisions(plan))
        check_calibration(plan, calibration or CalibrationArgs())
    source = check_loadable(model)
    if fmt == "gguf":
        check_gguf_source(source, source.model_id)
    check_out(out_dir, fmt)


__all__ = ["check_export", "check_out"]
