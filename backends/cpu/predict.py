"""The cost model's prediction for each bench side, on the measured `local` target.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autoplan.formats import DENSE, Choice, Precision

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

FP32 = Choice(DENSE, Precision.FP32)


def artifact_decisions(artifact: Any) -> dict[str, Choice]:
    """The per-layer choices an artifact's manifest records (what the export really runs)."""
    return {name: Choice.parse(entry["choice"])
            for name, entry in artifact.manifest.get("layers", {}).items()}


def kernel_rows(spec: Any, workload: Mapping[str, int], decisions: Mapping[str, Choice],
                manifest: Mapping[str, Any] | None = None) -> list[tuple]:
    """The (m, n, k, choice) GEMM rows one side runs (ort_microbench.Row).

    Layers the manifest records as packed into one node (q/k/v, gate/up) give one row at the
    node's summed width; the others one row each.
    """
    import math

    from autoplan.backends.cpu.ort_microbench import row_key
    from autoplan.cost.model import PREFILL_CHUNK
    from autoplan.cost.moe import expert_rows

    manifest = manifest or {}
    entries = manifest.get("layers", {})
    by_name = {layer.name: layer for layer in spec.layers}
    nodes: dict[str, list] = {}
    for layer in spec.layers:
        entry = entries.get(layer.name) or {}
        node = entry.get("node") if entry.get("columns") else None
        nodes.setdefault(node or layer.name, []).append(layer)
    b = int(workload["concurrency"])
    tokens = b * int(workload["input_len"])
    chunks = math.ceil(tokens / PREFILL_CHUNK)
    chunk_m = min(tokens, PREFILL_CHUNK)
    last_m = tokens - (chunks - 1) * chunk_m
    moe = getattr(spec, "moe", None)
    share = moe.top_k / moe.n_experts if moe is not None else 1.0  # uniform routing
    rows = []
    for members in nodes.values():
        first = members[0]
        choice = decisions.get(first.name, FP32)
        n = sum(by_name[m.name].out_features for m in members)
        ms = {b} if first.role == "lm_head" else {b, chunk_m, last_m}
        if first.expert >= 0:  # a picked routed expert's rows in each step (cost/moe.py)
            ms = {expert_rows(share, t) for t in ms}
        rows += [row_key(m, n, first.in_features, choice) for m in sorted(ms)]
    return list(dict.fromkeys(rows))


def predict_side(spec: Any, target: Any, workload: Mapping[str, int],
                 decisions: Mapping[str, Choice],
                 measured: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Predicted decode tok/s, TTFT and TPOT of one side (decisions: layer -> Choice).

    Layers the decisions leave out run fp32 in the export, so they are predicted fp32 too
    (not as the target's default baseline precision, which on a CPU target may differ).
    """
    from autoplan.cost import CostModel
    from autoplan.workload import Workload

    wl = Workload(batch=workload["concurrency"], input_len=workload["input_len"],
                  output_len=workload["output_len"])
    full = {layer.name: decisions.get(layer.name, FP32) for layer in spec.layers}
    # fp32 baseline: the embedding table, norms and anything undecided run fp32 in the export.
    metrics = CostModel(spec, target, wl, measured=measured,
                        baseline=FP32).evaluate(full).metrics
    return {"decode_tok_s": metrics.decode_tokens_per_s, "ttft_ms": metrics.ttft_s * 1e3,
            "tpot_ms": metrics.tpot_s * 1e3}


def prediction_block(spec: Any, target: Any, workload: Mapping[str, int],
                     side_decisions: Mapping[str, Mapping[str, Choice]],
                     measured: Mapping[str, Any],
                     artifacts: Mapping[str, Any] | None = None, threads: int | None = None,
                     progress: Any = None, spinning: bool = True) -> dict[str, Any]:
    """`BenchReport.predicted`: per side, predicted (cost model), measured, predicted/measured.

    Args:
        side_decisions: side name -> its per-layer decisions ({} = all fp32).
        measured: side name -> SideStats of that side.
        artifacts: side name -> CpuArtifact (ONNX Runtime on this machine). Given, the
            prediction uses measured ORT kernel times for the sides' GEMM nodes (timed once,
            then cached); `predicted_analytic` keeps the roofline-only figure.
        threads: ORT intra-op threads the sides ran with (None = physical cores).
        spinning: whether the sides' ORT pool threads spun (the kernel rows must match).
    """
    table = None
    side_rows: dict[str, list] = {}
    if artifacts:
        from autoplan.backends.cpu.ort_microbench import measure_rows, select

        for name, decisions in side_decisions.items():
            if name in artifacts:
                side_rows[name] = kernel_rows(spec, workload, decisions,
                                              artifacts[name].manifest)
        table = measure_rows([r for rows in side_rows.values() for r in rows], threads,
                             progress=progress, spinning=spinning)
        table = {**table, "non_gemm_decode_s": _non_gemm(artifacts, side_decisions, workload,
                                                         threads, progress, spinning)}
    sides: dict[str, Any] = {}
    for name, decisions in side_decisions.items():
        analytic = predict_side(spec, target, workload, decisions)
        pred = analytic
        if name in side_rows:
            pred = predict_side(spec, target, workload, decisions,
                                measured=select(table, side_rows[name]))
        stats = measured[name]
        meas = {"decode_tok_s": stats.decode_tok_s, "ttft_ms": stats.ttft_ms["p50"],
                "tpot_ms": stats.tpot_ms["p50"]}
        sides[name] = {"predicted": pred, "measured": meas,
                       "predicted_over_measured": {k: pred[k] / meas[k] if meas[k] else None
                                                   for k in pred}}
        if name in side_rows:
            sides[name]["kernels"] = "measured ORT kernels"
            sides[name]["predicted_analytic"] = analytic
            sides[name]["analytic_over_measured"] = {
                k: analytic[k] / meas[k] if meas[k] else None for k in analytic}
    source = ("cost model + measured ORT kernels (autoplan.cost.CostModel, "
              "backends/cpu/ort_microbench.py)" if side_rows
              else "cost model (autoplan.cost.CostModel)")
    out = {"source": source, "target": target.name, "sides": sides}
    if table is not None:
        out["kernel_table"] = {k: table.get(k) for k in ("device", "onnxruntime", "threads",
                                                          "includes_dispatch", "method", "spinning",
                                                          "non_gemm_decode_s")}
        out["kernel_table"]["rows"] = sum(len(r) for r in side_rows.values())
    return out


def search_kernel_table(loaded: LoadedModel, space: Any, workload: Any, threads: int | None = None,
                        spinning: bool = True, progress: Any = None) -> dict[str, Any]:
    """Measured ORT kernel rows for every (unit, choice) a CPU search may pick, plus the
    measured non-GEMM decode step: the CostModel(measured=...) of `autoplan search
    --measure-kernels` on `--target local --runtime onnxruntime`.

    The export packs a fused group (q/k/v, gate/up) into one node whenever its members share
    a format, which a search unit guarantees, so each unit is timed at its packed width.
    Rows are cached per machine (ort_microbench); the non-GEMM step is timed on a fresh fp32
    export of the model (batch-1 decode only, as in `prediction_block`).
    """
    import tempfile
    from pathlib import Path

    from autoplan.backends.cpu.ort_microbench import measure_rows

    wl = {"concurrency": workload.batch, "input_len": workload.input_len,
          "output_len": workload.output_len}
    manifest = {"layers": {layer.name: {"node": unit.name, "columns": [0, 1]}
                           for unit in space.units if len(unit.layers) > 1
                           for layer in unit.layers}}
    rows: list[tuple] = []
    for choice in dict.fromkeys((space.baseline, *space.all_choices)):
        decisions = {layer.name: choice for unit in space.units if choice in unit.choices
                     for layer in unit.layers}
        rows += kernel_rows(loaded.spec, wl, decisions, manifest)
    table = measure_rows(list(dict.fromkeys(rows)), threads, progress=progress,
                         spinning=spinning)
    non_gemm = None
    if workload.batch == 1:
        from autoplan.backends.cpu.onnx_export import export_cpu_model

        with tempfile.TemporaryDirectory(prefix="autoplan-nongemm-") as tmp:
            # the dense fp32 export, as bench's baseline (nothing in `decisions`)
            art = export_cpu_model(loaded.model, loaded.tokenizer, {}, Path(tmp) / "baseline")
            non_gemm = _time_non_gemm(art.model_path, wl, threads, progress, spinning)
    return {**table, "non_gemm_decode_s": non_gemm}


def _non_gemm(artifacts: Mapping[str, Any], side_decisions: Mapping[str, Any],
              workload: Mapping[str, int], threads: int | None, progress: Any,
              spinning: bool = True) -> float | None:
    """Measured non-GEMM decode seconds on an all-fp32 side's export (None without one, or
    for batched decode, which this measurement does not cover)."""
    if int(workload["concurrency"]) != 1:
        return None
    fp32 = [n for n, d in side_decisions.items()
            if n in artifacts and all(c == FP32 for c in d.values())]
    if not fp32:
        return None
    return _time_non_gemm(artifacts[fp32[0]].model_path, workload, threads, progress, spinning)


def _time_non_gemm(model_path: Any, workload: Mapping[str, int], threads: int | None,
                   progress: Any, spinning: bool) -> float:
    """The non-GEMM decode step of an fp32 export, at the workload's mean decode context."""
    from autoplan.backends.cpu.ort_microbench import non_gemm_decode_seconds

    if progress:
        progress("timing the decode step without its linear layers (fp32 export)")
    context = int(workload["input_len"]) + int(workload["output_len"]) // 2
    return non_gemm_decode_seconds(model_path, context, threads, spinning=spinning)


__all__ = ["FP32", "artifact_decisions", "kernel_rows", "predict_side", "prediction_block",
           "search_kernel_table"]
