"""Turn a plan into a runnable CPU artifact (ONNX Runtime): the library side of `autoplan apply`.

The plan's decisions are applied to the real model by autoplan.compress (masks and
quantized weights computed exactly as the quality measurement computed them), then exported
by backends/cpu/onnx_export.py with those very codes and scales.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.backends.cpu.onnx_export import CpuArtifact, export_cpu_model
from autoplan.backends.cpu.ort_quant import check_cpu_choices
from autoplan.bench.planfile import PlanInput
from autoplan.errors import PlanError, UnknownNameError, UnsupportedFormatError, UserInputError
from autoplan.formats import DENSE, Choice, Precision

BASELINE = Choice(DENSE, Precision.FP32)
CALIBRATION_TOKENS = 512  # tokens per calibration sequence
CALIBRATION_SEQUENCES = 32


def check_cpu_plan(plan: PlanInput) -> None:
    """Refuse (UserInputError, exit 2) a plan made for a GPU or holding formats ORT can't run."""
    if plan.target is not None and plan.target != "local":
        from autoplan.targets import get_target

        try:
            kind = get_target(plan.target).kind
        except UnknownNameError:
            kind = "unknown"
        if kind != "cpu":
            raise UnsupportedFormatError(
                f"plan targets '{plan.target}' ({kind}); CPU apply writes ONNX Runtime artifacts "
                "only: re-plan with --target local or a CPU target"
            )
    check_cpu_choices(plan.decisions)


def apply_plan_cpu(loaded: Any, plan: PlanInput, out_dir: str | Path, *,
                   calibration_text: str | None = None, accuracy_level: int = 0) -> CpuArtifact:
    """Compress `loaded` (autoplan.models.LoadedModel) by `plan` and export it to `out_dir`.

    Args:
        loaded: the loaded model (model, tokenizer, spec, content_hash).
        plan: the plan's decisions and settings.
        out_dir: artifact folder, written atomically; gets plan.json beside the model.
        calibration_text: text for the activation statistics that Wanda/SparseGPT masks and
            GPTQ need; plans without them do not need it.
        accuracy_level: MatMulNBits compute type for int4/int8_wo layers.
    """
    from autoplan.compress import CompressionSettings, collect_stats, compressed_copy

    check_cpu_plan(plan)
    if plan.content_hash and plan.content_hash != loaded.content_hash:
        raise PlanError(f"plan was made for model content {plan.content_hash[:12]}, this model "
                        f"is {loaded.content_hash[:12]}: apply it to the model it was searched on")
    unknown = sorted(set(plan.decisions) - {layer.name for layer in loaded.spec.layers})
    if unknown:
        raise PlanError(f"plan names layers this model lacks: {', '.join(unknown[:5])}")
    settings = CompressionSettings(**plan.compression) if plan.compression else \
        CompressionSettings(prune_score="magnitude")
    active = {k: c for k, c in plan.decisions.items() if c != BASELINE}
    stats = None
    sparse = any(c.sparsity.kind != "dense" for c in active.values())
    if settings.quant_method == "gptq" or (sparse and settings.prune_score != "magnitude"):
        batches = _calibration(loaded.tokenizer, calibration_text, settings)
        stats = collect_stats(loaded.model, active, batches)
    model, swapped = compressed_copy(loaded.model, active, stats, settings, baseline=BASELINE)
    quantized = {name: sim.quantized for name, sim in swapped.items()
                 if sim.choice.precision is not Precision.FP32}
    return export_cpu_model(model, loaded.tokenizer, plan.decisions, out_dir,
                            quantized=quantized, accuracy_level=accuracy_level,
                            extra_files={"plan.json": plan.text})


def export_baseline(loaded: Any, out_dir: str | Path) -> CpuArtifact:
    """The dense fp32 export of the same model: the same-runtime baseline for bench."""
    return export_cpu_model(loaded.model, loaded.tokenizer, {}, out_dir)


def _calibration(tokenizer: Any, text: str | None, settings: Any) -> list:
    import torch

    if not text:
        raise UserInputError(
            f"this plan's compression (prune_score={settings.prune_score}, quant_method="
            f"{settings.quant_method}) needs calibration statistics: pass --calibration FILE.txt"
        )
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    chunks = [ids[i: i + CALIBRATION_TOKENS]
              for i in range(0, len(ids) - CALIBRATION_TOKENS + 1, CALIBRATION_TOKENS)]
    if not chunks:
        raise UserInputError(f"calibration text is shorter than {CALIBRATION_TOKENS} tokens")
    return [torch.as_tensor(c)[None] for c in chunks[:CALIBRATION_SEQUENCES]]


__all__ = ["BASELINE", "apply_plan_cpu", "check_cpu_plan", "export_baseline"]
