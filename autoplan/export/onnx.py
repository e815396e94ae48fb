"""`--format onnx`: ONNX Runtime on CPU, written by the CPU backend's exporter.

The ONNX graph, its per-layer ORT quantization and its manifest belong to
``autoplan.backends.cpu.onnx_export``; this module only checks the plan like every other
format and hands it over (imported lazily: onnx is heavy and the backend may be absent).
The plan and the export audit travel as ``extra_files`` so they land in the same atomic
rename as the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import AutoplanError
from autoplan.export._prepare import Prepared
from autoplan.export._write import AUDIT_FILE, PLAN_FILE
from autoplan.formats import Choice, Precision

if TYPE_CHECKING:
    from autoplan.models import LoadedModel


class OnnxExporter:
    """Dispatches to ``autoplan.backends.cpu.onnx_export.export_cpu_model``."""

    name = "onnx"
    runtimes = ("onnxruntime",)

    def write(self, prep: Prepared, out_dir: str | Path) -> Path:
        """Export with the CPU backend: the plan's own weights (pruned, SparseGPT-updated) and
        quantized codes (GPTQ-rounded) are passed, so the ONNX model holds exactly the weights
        whose quality the plan measured instead of a second round-to-nearest."""
        try:
            from autoplan.backends.cpu.onnx_export import export_cpu_model
        except ModuleNotFoundError as exc:
            raise AutoplanError(f"the CPU ONNX exporter is not available ({exc.name} is "
                                "missing): install autoplan with its CPU backend") from None
        masks = {n: s.mask for n, s in prep.sims.items() if s.choice.sparsity.kind != "dense"}
        weights = {n: s.weight for n, s in prep.sims.items()}
        quantized = {n: s.quantized for n, s in prep.quantized().items()}
        audit = {"format": self.name, "runtime": prep.runtime,
                 "layers": {n: str(c) for n, c in sorted(prep.choices.items())},
                 "model": {"id": prep.plan.model.id,
                           "content_hash": prep.plan.model.content_hash}}
        extra = {PLAN_FILE: json.dumps(prep.plan.model_dump(mode="json"), indent=2,
                                       sort_keys=True) + "\n",
                 AUDIT_FILE: json.dumps(audit, indent=2, sort_keys=True) + "\n"}
        export_cpu_model(prep.loaded.model, prep.loaded.tokenizer, prep.choices, out_dir,
                         masks=masks, weights=weights, quantized=quantized, extra_files=extra)
        return Path(out_dir)


def write_decisions(loaded: LoadedModel, decisions: Mapping[str, Choice], out_dir: str | Path,
                    sims: Mapping[str, Any], plan_text: str) -> Path:
    """Write a decisions-only plan (no Plan, no audit to check) with its compressed layers
    ``sims``; the plan file travels as ``plan.json`` in the same atomic rename."""
    from autoplan.backends.cpu.onnx_export import export_cpu_model

    weights = {name: sim.weight for name, sim in sims.items()}
    quantized = {name: sim.quantized for name, sim in sims.items()
                 if sim.choice.precision is not Precision.FP32}
    return export_cpu_model(loaded.model, loaded.tokenizer, dict(decisions), out_dir,
                            weights=weights, quantized=quantized,
                            extra_files={"plan.json": plan_text}).path


__all__ = ["OnnxExporter", "write_decisions"]
