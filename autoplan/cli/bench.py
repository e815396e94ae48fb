"""`autoplan bench`: real generation on this machine, the fp32 baseline and the plan side by
side in one interleaved run (same ONNX Runtime), plus PyTorch eager fp32."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from autoplan.cli._args import positive_int
from autoplan.cli._output import console, emit_json, err_console, json_option
from autoplan.errors import UnsupportedFormatError, UserInputError

if TYPE_CHECKING:
    from autoplan.bench import BenchReport


def _table(report: BenchReport) -> Table:
    w = report.workload
    table = Table(title=f"MEASURED on this machine ({report.threads} threads): {w['requests']} "
                        f"requests, concurrency {w['concurrency']}, {w['input_len']} in / "
                        f"{w['output_len']} out")
    table.add_column("metric")
    for side in report.sides:
        table.add_column(side.name, justify="right")
    rows = [("prefill tok/s (median)", lambda s: f"{s.prefill_tok_s:,.0f}"),
            ("decode tok/s (median)", lambda s: f"{s.decode_tok_s:,.1f}")]
    for p in ("p50", "p95", "p99"):
        rows.append((f"TTFT ms {p}", lambda s, p=p: f"{s.ttft_ms[p]:,.1f}"))
    for p in ("p50", "p95", "p99"):
        rows.append((f"TPOT ms {p}", lambda s, p=p: f"{s.tpot_ms[p]:,.2f}"))
    rows += [("weights MB", lambda s: "-" if s.weight_mb is None else f"{s.weight_mb:,.0f}"),
             ("RSS added on load MB", lambda s: f"{s.rss_load_mb:,.0f}"),
             ("decode % of bandwidth roofline",
              lambda s: "-" if s.roofline_fraction is None else f"{s.roofline_fraction:.0%}")]
    for label, fn in rows:
        table.add_row(label, *[fn(s) for s in report.sides])
    if any(s.name == "baseline" for s in report.sides) and len(report.sides) > 1:
        ratios = {s.name: report.ratios(s.name) for s in report.sides if s.name != "baseline"}
        table.add_row("decode speed vs baseline",
                      *["1.00x" if s.name == "baseline" else
                        f"{ratios[s.name]['decode_tok_s']:.2f}x" for s in report.sides])
    return table


def _prediction_table(predicted: dict) -> Table:
    kind = ("cost model + measured ORT kernels" if "ORT kernels" in predicted["source"]
            else "cost model")
    table = Table(title=f"predicted ({kind}, target {predicted['target']}) vs measured")
    for col in ("side", "metric", "predicted (cost model)", "measured", "predicted/measured"):
        table.add_column(col, justify="left" if col in ("side", "metric") else "right")
    for name, side in predicted["sides"].items():
        for key, label in (("decode_tok_s", "decode tok/s"), ("ttft_ms", "TTFT ms (p50)"),
                           ("tpot_ms", "TPOT ms (p50)")):
            ratio = side["predicted_over_measured"][key]
            table.add_row(name, label, f"{side['predicted'][key]:,.1f}",
                          f"{side['measured'][key]:,.1f}", "-" if ratio is None else f"{ratio:.2f}")
    return table


@click.command("bench")
@click.option("--model", required=True, help="Model: alias, HF folder or GGUF.")
@click.option("--plan", "plan_path", default=None, help="Plan JSON to apply and measure.")
@click.option("--artifact", default=None, help="Artifact folder from `autoplan apply`.")
@click.option("--requests", type=int, default=8, show_default=True)
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="Requests batched into one static batch.")
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=64, show_default=True)
@click.option("--no-torch", is_flag=True, help="Skip the PyTorch eager fp32 reference.")
@click.option("--share-weights", is_flag=True,
              help="The PyTorch side and the fp32 baseline compute from one copy of the "
                   "weights: about half the memory, but the baseline runs unprepacked "
                   "(its prefill 9-15 %% slower per MatMul on an AVX2 EPYC; decode alike).")
@click.option("--threads", type=int, default=None, help="Threads (default: physical cores).")
@click.option("--no-spin", is_flag=True,
              help="ORT pool threads sleep between ops (for a machine shared with other jobs; "
                   "the default spins, as a dedicated serving node does).")
@json_option
def command(model: str, plan_path: str | None, artifact: str | None, requests: int,
            concurrency: int, input_len: int, output_len: int, no_torch: bool,
            share_weights: bool, threads: int | None, no_spin: bool, as_json: bool) -> None:
    """Measure prefill/decode tok/s, TTFT, TPOT and memory: baseline vs plan, one run."""
    for flag, value in (("requests", requests), ("concurrency", concurrency),
                        ("input-len", input_len), ("output-len", output_len),
                        ("threads", threads)):
        positive_int(flag, value)
    if plan_path and artifact:
        raise UserInputError("pass --plan or --artifact, not both")
    from autoplan.plan.io import read_plan

    plan = read_plan(plan_path) if plan_path else None  # before the stack: a missing plan
    if artifact:  # and a folder holding no artifact
        from autoplan.backends.cpu.manifest import require_manifest

        require_manifest(artifact)
    from autoplan.backends.cpu.onnx_export import CpuArtifact
    from autoplan.backends.cpu.predict import artifact_decisions, prediction_block
    from autoplan.backends.registry import resolve_target as get_target
    from autoplan.bench import ort_side, read_bandwidth, run_bench, shared_weights, torch_side
    from autoplan.export.apply import apply_format, apply_plan, export_baseline, load_checked
    from autoplan.export.calibration import CalibrationArgs, check_calibration, plan_calibration
    from autoplan.heap import release_kept_memory
    from autoplan.models import check_loadable

    if plan is not None and apply_format(plan) != "onnx":  # refused before loading the model
        raise UnsupportedFormatError(f"plan targets '{plan.target}'; bench runs ONNX Runtime "
                                     "on this CPU: re-plan with --target local")
    if plan is not None and plan.full is not None:
        check_calibration(plan.full, CalibrationArgs())  # a text bench cannot be given
    given = CpuArtifact.load(artifact) if artifact else None  # a bad folder: refused now
    check_loadable(model)
    err_console.print(f"loading {model} ...")
    loaded = load_checked(model)
    with tempfile.TemporaryDirectory(prefix="autoplan-bench-") as tmp:
        err_console.print("exporting the fp32 baseline ...")
        arts = [("baseline", CpuArtifact.load(export_baseline(loaded, Path(tmp) / "baseline")))]
        decisions: dict[str, dict] = {"baseline": {}}
        if plan is not None:
            decisions["plan"] = plan.decisions
            err_console.print("applying the plan ...")
            batches = plan_calibration(plan.full, loaded) if plan.full is not None else None
            arts.append(("plan", CpuArtifact.load(apply_plan(loaded, plan, Path(tmp) / "plan",
                                                             calibration=batches))))
        elif given is not None:
            arts.append(("plan", given))
            decisions["plan"] = artifact_decisions(given)
        # --share-weights: the PyTorch side and the fp32 baseline's session compute from one
        # copy of the weights (Gemma-3-270M's shape: 1.0 GiB; bench.runner.shared_weights).
        # Not by default: a shared weight cannot be prepacked, which slows the baseline's
        # prefill, and the baseline is the denominator of every ratio bench reports.
        shared = {"baseline": shared_weights(loaded.model, arts[0][1])} \
            if share_weights and not no_torch else {}
        sides = [ort_side(name, art, threads, spinning=not no_spin, shared=shared.get(name))
                 for name, art in arts]
        if not no_torch:
            sides.append(torch_side(loaded.model, threads))
        bandwidth = lambda: read_bandwidth(threads=threads)  # sampled once per batch round
        report = run_bench(sides, requests=requests, concurrency=concurrency,
                           input_len=input_len, output_len=output_len, vocab=loaded.spec.vocab,
                           bandwidth=bandwidth, threads=threads,
                           progress=None if as_json else lambda m: err_console.print(m))
        if shared.get("baseline"):
            report.notes.append("the fp32 baseline's ONNX Runtime session and the PyTorch side "
                                "compute from one copy of the weights (shared, not prepacked): "
                                "the baseline's RSS added on load leaves them out")
        # the timed sessions and the PyTorch model go before the kernel timing, which builds
        # sessions of its own (a 262k-vocabulary lm_head row is a 0.67 GB weight)
        spec = loaded.spec
        sides.clear()
        shared.clear()
        del loaded
        gc.collect()
        release_kept_memory()  # glibc keeps the freed model's pages otherwise (0.45 GiB)
        # On this CPU the linear layers are predicted from measured ORT kernel times
        # (timed once per machine and shape, then cached): see autoplan.backends.cpu.predict.
        report.predicted = prediction_block(
            spec, get_target("local"), report.workload, decisions,
            {s.name: s for s in report.sides}, artifacts=dict(arts), threads=threads,
            progress=None if as_json else lambda m: err_console.print(m), spinning=not no_spin)
    if as_json:
        emit_json(report.to_json())
        return
    console.print(_table(report))
    console.print(_prediction_table(report.predicted))
    console.print(f"peak RSS of this process {report.peak_rss_mb:,.0f} MB; measured read "
                  f"bandwidth {report.bandwidth_gbps:.1f} GB/s")


__all__ = ["command"]
