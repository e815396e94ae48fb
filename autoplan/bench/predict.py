"""The cost model's prediction for each bench side, on the measured `local` target.

Bench exists to check the planner: every ONNX side is predicted by the same CostModel the
search used (`local` target, Workload(batch=concurrency, input_len, output_len)) and the
report shows predicted next to measured with their ratio. The baseline is predicted as
dense fp32 on every linear layer, lm_head included, which is what the baseline export runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoplan.formats import DENSE, Choice, Precision

FP32 = Choice(DENSE, Precision.FP32)


def artifact_decisions(artifact: Any) -> dict[str, Choice]:
    """The per-layer choices an artifact's manifest records (what the export really runs)."""
    return {name: Choice.parse(entry["choice"])
            for name, entry in artifact.manifest.get("layers", {}).items()}


def predict_side(spec: Any, target: Any, workload: Mapping[str, int],
                 decisions: Mapping[str, Choice]) -> dict[str, float]:
    """Predicted decode tok/s, TTFT and TPOT of one side (decisions: layer -> Choice).

    Layers the decisions leave out run fp32 in the export, so they are predicted fp32 too
    (not as the target's default baseline precision, which on a CPU target may differ).
    """
    from autoplan.cost import CostModel
    from autoplan.workload import Workload

    wl = Workload(batch=workload["concurrency"], input_len=workload["input_len"],
                  output_len=workload["output_len"])
    full = {layer.name: decisions.get(layer.name, FP32) for layer in spec.layers}
    metrics = CostModel(spec, target, wl).evaluate(full).metrics
    return {"decode_tok_s": metrics.decode_tokens_per_s, "ttft_ms": metrics.ttft_s * 1e3,
            "tpot_ms": metrics.tpot_s * 1e3}


def prediction_block(spec: Any, target: Any, workload: Mapping[str, int],
                     side_decisions: Mapping[str, Mapping[str, Choice]],
                     measured: Mapping[str, Any]) -> dict[str, Any]:
    """`BenchReport.predicted`: per side, predicted (cost model), measured, predicted/measured.

    Args:
        side_decisions: side name -> its per-layer decisions ({} = all fp32).
        measured: side name -> SideStats of that side.
    """
    sides: dict[str, Any] = {}
    for name, decisions in side_decisions.items():
        pred = predict_side(spec, target, workload, decisions)
        stats = measured[name]
        meas = {"decode_tok_s": stats.decode_tok_s, "ttft_ms": stats.ttft_ms["p50"],
                "tpot_ms": stats.tpot_ms["p50"]}
        sides[name] = {"predicted": pred, "measured": meas,
                       "predicted_over_measured": {k: pred[k] / meas[k] if meas[k] else None
                                                   for k in pred}}
    return {"source": "cost model (autoplan.cost.CostModel)", "target": target.name,
            "sides": sides}


__all__ = ["FP32", "artifact_decisions", "predict_side", "prediction_block"]
