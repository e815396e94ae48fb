"""`autoplan apply`: `autoplan export` with the default format of the backend that drives the
plan's target (ONNX for CPU targets, compressed-tensors for GPUs).

A full plan goes through ``export_plan`` like any export (model hash, runtime and fused-group
checks, recompression with the plan's settings and calibration, the audit check). A minimal
plan (decisions only, CPU targets) is compressed with magnitude masks and round-to-nearest
weights, which need no calibration, and written by the same ONNX writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.backends.registry import backend_for, resolve_target
from autoplan.errors import PlanError, UnknownNameError, UnsupportedFormatError, UserInputError
from autoplan.export import export_plan, exporter_names, get_exporter
from autoplan.export._prepare import check_runtime, pick_runtime
from autoplan.formats import DENSE, Choice, Precision
from autoplan.models.registry import aliases
from autoplan.plan.io import PlanInput
from autoplan.plan.schema import Plan
from autoplan.targets import Target

if TYPE_CHECKING:
    from autoplan.models import LoadedModel
    from autoplan.recover import RecoveredWeights

BASELINE = Choice(DENSE, Precision.FP32)
MINIMAL_FORMAT = "onnx"  # the one format a decisions-only plan can be written in


def apply_target(plan: PlanInput) -> Target:
    """The plan's target (`local` when a minimal plan names none).

    Raises:
        UnsupportedFormatError: the target is unknown.
    """
    try:
        return resolve_target(plan.target or "local")
    except UnknownNameError:
        raise UnsupportedFormatError(
            f"plan targets '{plan.target}', which is not a known target: re-plan with "
            "--target local or a target `autoplan targets` lists") from None


def apply_format(plan: PlanInput) -> str:
    """The format `apply` writes for ``plan``, refused before any model is loaded.

    The backend driving the plan's target names its default format; every layer must be one
    that format's runtime accelerates there (``autoplan.runtimes.supports``, the runtime
    matrix, the same answer search gets).

    Raises:
        UnsupportedFormatError: a minimal plan for a GPU target, or a refused layer.
    """
    target = apply_target(plan)
    fmt = backend_for(target).default_format
    if plan.full is None and fmt != MINIMAL_FORMAT:
        raise UnsupportedFormatError(
            f"plan targets '{target.name}' ({target.kind}) but holds decisions only; apply "
            f"writes {fmt} from full plans: re-plan with `autoplan search --target "
            f"{target.name}`, or --target local for a CPU artifact")
    exporter = get_exporter(fmt)
    runtime = (pick_runtime(plan.full, exporter.runtimes) if plan.full is not None
               else exporter.runtimes[0])
    check_runtime(fmt, target, runtime, plan.decisions)
    return fmt


def runtime_note(plan: PlanInput, fmt: str) -> str | None:
    """What to tell the user when `apply` writes for another runtime than the one the plan
    was searched for (its predictions are that runtime's), else None."""
    if plan.full is None:
        return None
    planned = plan.full.runtime.name
    exporter = get_exporter(fmt)
    if planned in exporter.runtimes:
        return None
    theirs = [name for name in exporter_names() if planned in get_exporter(name).runtimes]
    how = (f"`autoplan export --format {theirs[0]}` writes what {planned} loads" if theirs
           else f"no export format of autoplan's loads into {planned}")
    return (f"the plan was searched for {planned}, but apply writes {fmt}, which "
            f"{exporter.runtimes[0]} runs: its predicted speed is {planned}'s; {how}")


def apply_plan(loaded: LoadedModel, plan: PlanInput, out_dir: str | Path, *,
               calibration: Any = None, allow_model_mismatch: bool = False,
               recovered: RecoveredWeights | None = None) -> Path:
    """Compress ``loaded`` by ``plan`` and write the default format's artifact to ``out_dir``.

    Args:
        loaded: the LoadedModel (model, tokenizer, spec, content_hash).
        plan: the plan (``autoplan.plan.read_plan``).
        out_dir: artifact folder, written atomically.
        calibration: token batches of the plan's calibration set, needed only by full plans
            whose masks, GPTQ weights or NVFP4 scales depend on activations
            (``autoplan.export.calibration.plan_calibration``).
        allow_model_mismatch: apply a full plan to a model with another content hash.
        recovered: a recovered plan's weights (``recovered_weights``).

    Returns:
        The artifact path.
    """
    fmt = apply_format(plan)
    if plan.full is not None:
        return export_plan(plan.full, loaded, fmt, out_dir, calibration=calibration,
                           allow_model_mismatch=allow_model_mismatch, recovered=recovered)
    from autoplan.export.onnx import write_decisions

    return write_decisions(loaded, plan.decisions, out_dir, _minimal_sims(loaded, plan),
                           plan_text=plan.text)


def _minimal_sims(loaded: LoadedModel, plan: PlanInput) -> dict[str, Any]:
    from autoplan.compress import CompressionSettings, compress_linear
    from autoplan.models.graph import get_linear

    unknown = sorted(set(plan.decisions) - {layer.name for layer in loaded.spec.layers})
    if unknown:
        raise PlanError(f"plan names layers this model lacks: {', '.join(unknown[:5])}")
    settings = CompressionSettings(prune_score="magnitude", quant_method="rtn")
    return {name: compress_linear(get_linear(loaded.model, name), choice, None, settings)
            for name, choice in plan.decisions.items() if choice != BASELINE}


def recovered_weights(plan: Plan, plan_path: str | Path, given: str | Path | None
                      ) -> RecoveredWeights | None:
    """A recovered plan's weights (the file it names beside it, or ``given``), checked
    against its sha256; None for a plan that was not recovered."""
    if plan.recovery is None:
        if given is not None:
            raise UserInputError("--recovered is for recovered plans; this plan has no "
                                 "recovery section")
        return None
    from autoplan.recover import read_recovered, resolve_weights_file

    path = resolve_weights_file(plan_path, plan.recovery.weights_file, given)
    return read_recovered(path, plan.recovery.weights_sha256)


def plan_model_arg(plan_model: str | None, model: str | None) -> str:
    """The model to load for ``plan``: the user's ``--model``, else the plan's model when it
    is a registered alias. A plan file comes from someone else, so its ``model.id`` is never
    opened as a path.

    Raises:
        UserInputError: no --model and the plan names no alias.
    """
    if model:
        return model
    if not plan_model:
        raise UserInputError("this plan does not name its model: pass --model")
    if plan_model.strip().lower() not in aliases():
        raise UserInputError(
            f"this plan was made for '{plan_model}', which autoplan does not open from a "
            "plan file: pass --model with that model's folder or file")
    return plan_model


def load_checked(model: str) -> Any:
    """``load_model`` after checking the model's files from their headers (one line on a
    truncated, empty or garbage file instead of a traceback)."""
    from autoplan.models import check_loadable, load_model

    check_loadable(model)
    return load_model(model)


def export_baseline(loaded: LoadedModel, out_dir: str | Path) -> Path:
    """The dense fp32 ONNX export of the same model: the same-runtime baseline for bench."""
    from autoplan.backends.cpu.onnx_export import export_cpu_model

    return export_cpu_model(loaded.model, loaded.tokenizer, {}, out_dir).path


__all__ = ["BASELINE", "apply_format", "apply_plan", "apply_target", "export_baseline",
           "load_checked", "plan_model_arg", "recovered_weights", "runtime_note"]
