"""Turn a plan into a runnable CPU artifact (ONNX Runtime): the library side of `autoplan apply`.

A full plan goes through autoplan.export's `prepare` (model hash, runtime and fused-group
checks, recompression with the plan's settings and calibration statistics, and the check of
every mask and scale against the plan's audit). A minimal plan (decisions only) is
compressed with magnitude masks and round-to-nearest weights, which need no calibration.
Either way the exporter gets the compressed weights, codes and scales themselves, so the
ONNX model holds exactly the weights whose quality was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoplan.backends.cpu.onnx_export import CpuArtifact, export_cpu_model
from autoplan.backends.cpu.ort_quant import check_cpu_choices
from autoplan.bench.planfile import PlanInput
from autoplan.errors import PlanError, UnknownNameError, UnsupportedFormatError
from autoplan.formats import DENSE, Choice, Precision
from autoplan.targets import get_target

BASELINE = Choice(DENSE, Precision.FP32)
RUNTIMES = ("onnxruntime",)


def check_cpu_plan(plan: PlanInput) -> None:
    """Refuse (UserInputError, exit 2) a plan made for a GPU or holding formats ORT can't run.

    The formats are judged by the runtime matrix (autoplan.runtimes.supports) on the plan's
    CPU target, or on this machine (`local`) when the plan names none -- the same answer
    `autoplan search --runtime onnxruntime` gets, so apply accepts what search can plan.
    """
    try:
        target = get_target(plan.target or "local")
    except UnknownNameError:
        target = None
    if target is None or target.kind != "cpu":
        kind = "unknown" if target is None else target.kind
        raise UnsupportedFormatError(
            f"plan targets '{plan.target}' ({kind}); CPU apply writes ONNX Runtime artifacts "
            "only: re-plan with --target local or a CPU target"
        )
    check_cpu_choices(plan.decisions, target)


def apply_plan_cpu(loaded: Any, plan: PlanInput, out_dir: str | Path, *,
                   calibration: Sequence[Any] | None = None,
                   allow_model_mismatch: bool = False) -> CpuArtifact:
    """Compress `loaded` (autoplan.models.LoadedModel) by `plan` and export it to `out_dir`.

    Args:
        loaded: the loaded model (model, tokenizer, spec, content_hash).
        plan: the plan's decisions (and the full Plan when the file is one).
        out_dir: artifact folder, written atomically; gets plan.json beside the model.
        calibration: token batches of the plan's calibration set, needed only by full plans
            whose Wanda/SparseGPT masks or GPTQ weights depend on activations.
        allow_model_mismatch: apply a full plan to a model with another content hash.
    """
    check_cpu_plan(plan)
    if plan.full is not None:
        from autoplan.export._prepare import prepare

        sims = prepare(plan.full, loaded, "onnx", RUNTIMES, calibration=calibration,
                       allow_model_mismatch=allow_model_mismatch).sims
    else:
        sims = _minimal_sims(loaded, plan)
    weights = {name: sim.weight for name, sim in sims.items()}
    quantized = {name: sim.quantized for name, sim in sims.items()
                 if sim.choice.precision is not Precision.FP32}
    return export_cpu_model(loaded.model, loaded.tokenizer, plan.decisions, out_dir,
                            weights=weights, quantized=quantized,
                            extra_files={"plan.json": plan.text})


def _minimal_sims(loaded: Any, plan: PlanInput) -> dict[str, Any]:
    from autoplan.compress import CompressionSettings, compress_linear
    from autoplan.models.graph import get_linear

    unknown = sorted(set(plan.decisions) - {layer.name for layer in loaded.spec.layers})
    if unknown:
        raise PlanError(f"plan names layers this model lacks: {', '.join(unknown[:5])}")
    settings = CompressionSettings(prune_score="magnitude", quant_method="rtn")
    return {name: compress_linear(get_linear(loaded.model, name), choice, None, settings)
            for name, choice in plan.decisions.items() if choice != BASELINE}


def export_baseline(loaded: Any, out_dir: str | Path) -> CpuArtifact:
    """The dense fp32 export of the same model: the same-runtime baseline for bench."""
    return export_cpu_model(loaded.model, loaded.tokenizer, {}, out_dir)


__all__ = ["BASELINE", "apply_plan_cpu", "check_cpu_plan", "export_baseline"]
