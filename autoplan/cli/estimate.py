"""`autoplan estimate`: predicted speed, memory, energy and $ of one uniform choice vs the
uncompressed baseline, optionally with the per-layer breakdown."""

from __future__ import annotations

from dataclasses import replace

import click
from pydantic import ValidationError
from rich.table import Table

from autoplan.cli._args import finite_non_negative, positive_int
from autoplan.cli._output import console, emit_json, err_console, json_option
from autoplan.cli._workload_options import operating_from, workload_options
from autoplan.cost import CostModel, Estimate, LayerBreakdown, resolve_config
from autoplan.cost.measured import load_cost_table
from autoplan.cost.moe import Routing, routed_expert_choice, uniform_with_experts
from autoplan.cost.operating import NoOperatingPoint, OperatingPoint, resolve_operating_point
from autoplan.cost.routing_file import read_routing
from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.formats import Choice, Precision, Sparsity
from autoplan.formats.kv import KvFormat, parse_kv_mix
from autoplan.models.registry import resolve_model_arg
from autoplan.runtimes import (default_kv, default_runtime, kv_of_mix, kv_supports,
                               runtime_names, supports)
from autoplan.backends.registry import resolve_target as get_target
from autoplan.workload import Workload

# (label, Metrics attribute, unit scale, format, higher is better)
_ROWS = (
    ("decode tokens/s (predicted)", "decode_tokens_per_s", 1.0, "rate", True),
    ("output tokens/s end-to-end (predicted)", "throughput", 1.0, "rate", True),
    ("TTFT ms (predicted)", "ttft_s", 1e3, "{:,.2f}", False),
    ("TPOT ms (predicted)", "tpot_s", 1e3, "{:,.3f}", False),
    ("request latency s (predicted)", "request_latency_s", 1.0, "{:,.3f}", False),
    ("energy J/output token (predicted)", "energy", 1.0, "{:,.4f}", False),
    ("$ per 1M output tokens (predicted)", "cost", 1.0, "{:,.4f}", False),
)


def _figure(fmt: str, value: float) -> str:
    """A row's value; a rate in whole tokens/s from 100 up, else to 3 significant digits (a
    70B model on one CPU decodes 2.4 tok/s, not "2")."""
    if fmt == "rate":
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return fmt.format(value)


def _speedups(cand: Estimate, base: Estimate) -> dict[str, float]:
    out = {}
    for _label, attr, _scale, _fmt, higher in _ROWS:
        c, b = getattr(cand.metrics, attr), getattr(base.metrics, attr)
        if c and b:
            out[attr] = c / b if higher else b / c
    return out


def _summary(cand: Estimate, base: Estimate, label: str, runtime: str,
             base_status: str | None = None) -> Table:
    """Side by side; `base_status` ("does not fit", "misses the SLO") replaces the baseline's
    speed figures when it cannot run (its memory is shown at the batch it was tried at)."""
    batches = (f"{cand.workload['batch']}" if cand.workload == base.workload or base_status
               else f"{cand.workload['batch']} vs {base.workload['batch']}")
    table = Table(title=f"{cand.model} on {cand.target} ({runtime}), batch "
                        f"{batches}, {cand.workload['input_len']} in / "
                        f"{cand.workload['output_len']} out: PREDICTED by the cost model")
    table.add_column("metric")
    table.add_column(label, justify="right")
    table.add_column(f"baseline {base.baseline}, KV {base.kv.format}"
                     + (f" ({base_status})" if base_status else ""), justify="right")
    table.add_column("gain", justify="right")
    speed = {} if base_status else _speedups(cand, base)
    for label, attr, scale, fmt, _higher in _ROWS:
        table.add_row(label, _figure(fmt, getattr(cand.metrics, attr) * scale),
                      f"[red]{base_status}[/red]" if base_status
                      else _figure(fmt, getattr(base.metrics, attr) * scale),
                      f"{speed[attr]:.2f}x" if attr in speed else "-")
    at_one = (f" (batch {base.workload['batch']})"
              if base_status and base.workload != cand.workload else "")
    for label, est_mem in (("memory GB", lambda e: e.memory.total_bytes / 1e9),
                           ("  weights GB", lambda e: e.memory.weights_bytes / 1e9),
                           ("  KV cache GB", lambda e: e.memory.kv_cache_bytes / 1e9),
                           ("  workspace GB", lambda e: e.memory.workspace_bytes / 1e9),
                           ("active weights GB read per token",
                            lambda e: e.active_weight_bytes / 1e9)):
        table.add_row(label, f"{est_mem(cand):,.2f}", f"{est_mem(base):,.2f}{at_one}", "")
    table.add_row("batch (concurrent sequences)", f"{cand.workload['batch']:,}",
                  f"{base.workload['batch']:,}{at_one and ' (tried)'}",
                  "-" if base_status else
                  f"{cand.workload['batch'] / base.workload['batch']:.2f}x")
    table.add_row("KV cache format", cand.kv.format, base.kv.format, "")
    table.add_row("  KV KiB per token (all blocks)", f"{cand.kv.bytes_per_token / 1024:,.1f}",
                  f"{base.kv.bytes_per_token / 1024:,.1f}", "")
    table.add_row("  KV GB read per decode step", f"{cand.kv.read_bytes / 1e9:,.3f}",
                  f"{base.kv.read_bytes / 1e9:,.3f}", "")
    fit = lambda e: "yes" if e.memory.fits else "[red]NO[/red]"  # noqa: E731
    table.add_row(f"fits ({cand.memory.capacity_bytes / 1e9:,.0f} GB usable)", fit(cand),
                  fit(base), "")
    table.add_row("MBU (predicted)", f"{cand.mbu:.2f}",
                  "-" if base_status else f"{base.mbu:.2f}", "")
    return table


def _breakdown(est: Estimate) -> Table:
    table = Table(title="per-layer breakdown (predicted)")
    for col in ("layer", "choice", "prefill ms", "decode us", "decode share", "weights MB"):
        table.add_column(col, justify="left" if col in ("layer", "choice") else "right",
                         overflow="fold")
    decode = est.metrics.decode_s
    for row in _experts_grouped(est.layers):
        table.add_row(row.name, row.choice, f"{row.prefill_s * 1e3:.3f}",
                      f"{row.decode_s * 1e6:.1f}", f"{row.decode_s / decode:.1%}",
                      f"{row.weight_bytes / 1e6:.1f}")
    for name, t in est.fixed.items():
        table.add_row(f"[dim]{name}[/dim]", "-", f"{t.prefill_s * 1e3:.3f}",
                      f"{t.decode_s * 1e6:.1f}", f"{t.decode_s / decode:.1%}", "-")
    return table


def _kv_breakdown(est: Estimate) -> Table:
    """Each block's KV cache: format, bytes per token, what a step reads, its attention time
    (part of the `attention` row above)."""
    batch = est.workload["batch"]
    table = Table(title=f"KV cache per block (predicted; batch {batch:,}, "
                        f"{est.kv.bytes_per_token / 1024:,.1f} KiB per token, "
                        f"{est.kv.bytes_per_sequence / 2**20:,.1f} MiB per sequence, "
                        f"{est.memory.kv_cache_bytes / 1e9:,.2f} GB for the batch)")
    for col in ("block", "format", "window", "KiB/token", "MB read/step", "attn decode us",
                "attn prefill ms"):
        table.add_column(col, justify="left" if col in ("block", "format") else "right")
    for row in est.kv.blocks:
        table.add_row(str(row.block), row.format, str(row.window or "-"),
                      f"{row.bytes_per_token / 1024:.2f}", f"{row.read_bytes / 1e6:,.2f}",
                      f"{row.decode_s * 1e6:.1f}", f"{row.prefill_s * 1e3:.3f}")
    return table


def _experts_grouped(rows: tuple[LayerBreakdown, ...]) -> list[LayerBreakdown]:
    """The breakdown with each block's routed experts summed into one row (`...experts`,
    all E experts, one choice: they are one decision unit)."""
    out: list[LayerBreakdown] = []
    at: dict[str, int] = {}
    for row in rows:
        if not row.role.startswith("expert_"):
            out.append(row)
            continue
        group = row.name[: row.name.index(".experts.") + len(".experts")]
        if group not in at:
            at[group] = len(out)
            out.append(LayerBreakdown(group, "experts", row.choice, 0.0, 0.0, 0.0))
        old = out[at[group]]
        out[at[group]] = replace(old, prefill_s=old.prefill_s + row.prefill_s,
                                 decode_s=old.decode_s + row.decode_s,
                                 weight_bytes=old.weight_bytes + row.weight_bytes)
    return out


def _pick_runtime(tgt, runtime: str | None, choice: Choice):
    """The named runtime; else the target's default, or the first runtime that accelerates
    the choice when the default cannot (said on stderr so the user knows)."""
    if runtime:
        return runtime, supports(tgt, runtime, choice)
    default = default_runtime(tgt)
    first = supports(tgt, default, choice)
    if first.ok:
        return default, first
    for name in runtime_names():
        answer = supports(tgt, name, choice)
        if answer.ok:
            err_console.print(f"note: {default} cannot run {choice} ({first.reason}); "
                              f"estimating for {name}")
            return name, answer
    return default, first



def _runtime_baseline(tgt, runtime: str, preferred: Choice) -> Choice:
    """The uncompressed format `runtime` serves on `tgt`: the target's usual one (BF16 where
    the hardware has BF16 math), else FP32 (ONNX Runtime has no fast BF16 CPU kernel, so a
    BF16 baseline there would be a column no server runs)."""
    if supports(tgt, runtime, preferred).ok:
        return preferred
    fp32 = Choice(preferred.sparsity, Precision.FP32)
    return fp32 if supports(tgt, runtime, fp32).ok else preferred


def _kept_embedding(measured: dict | None, model: str, runtime: str) -> dict | None:
    """The cost table, with how a GGUF model stores its token embedding when llama.cpp runs
    it: autoplan's GGUF exports keep the file's token_embd (and tie lm_head to it in its
    type), so memory counts it as stored, as the search does (ggml_microbench)."""
    if runtime != "llama.cpp":
        return measured
    try:
        source = resolve_model_arg(model)
    except AutoplanError:  # a bundled config name or a config.json: no file to read
        return measured
    if source.path.suffix.lower() != ".gguf":
        return measured
    from autoplan.engines.ggml_microbench import gguf_embedding

    embedding = gguf_embedding(source.path)
    return {**(measured or {"rows": []}), "embedding": embedding} if embedding else measured


@click.command("estimate")
@click.option("--model", "model", required=True,
              help="HF model folder, config.json, or bundled name (e.g. llama-3.1-8b).")
@click.option("--target", required=True, help="Hardware target (autoplan targets), e.g. h100.")
@click.option("--precision", default=None, help="e.g. bf16, fp8, int8, int4_g128, nvfp4.")
@click.option("--sparsity", default="dense", show_default=True,
              help="dense, 2:4, block32@50, channel@25, unstructured@50.")
@click.option("--runtime", default=None, help="Serving runtime (default: the target's).")
@click.option("--kv-cache", "kv_cache", default=None,
              help="KV-cache format of the candidate, e.g. fp8 (fp8_e4m3), fp8_e4m3_head, "
                   "fp8_e5m2, int8, nvfp4, q8_0, q4_0 (default: the runtime's own cache).")
@workload_options(1)
@click.option("--price-per-hour", type=float, default=None, help="$/hour (default: catalog).")
@click.option("--cost-table", default=None, help="Measured GEMM times (cost_table.json from benchmarks/gpu_check.sh).")
@click.option("--routing", "routing_file", default=None, metavar="FILE",
              help="Mixture-of-experts routing shares: a plan.json from an MoE search or a "
                   "profile JSON (default: uniform, top_k / E per expert).")
@click.option("--breakdown", is_flag=True, help="Show the per-layer breakdown.")
@json_option
def command(model: str, target: str, precision: str | None, sparsity: str, runtime: str | None,
            kv_cache: str | None, batch: str | None, input_len: int, output_len: int, ttft_ms: float | None,
            tpot_ms: float | None, price_per_hour: float | None, cost_table: str | None,
            routing_file: str | None, breakdown: bool, as_json: bool) -> None:
    """Predict speed, memory, energy and $/1M tokens of one choice for every linear layer
    (and a KV-cache format with --kv-cache) against the uncompressed baseline.

    With `--batch max` or an SLO each side is evaluated at its own operating point (a
    smaller format fits, or meets the SLO at, a larger batch), as vendors' "max throughput"
    tables compare them."""
    kv_mix = parse_kv_mix(kv_cache) if kv_cache else None  # FORMAT@BLOCKS items
    kv_asked = KvFormat.parse(kv_cache) if kv_cache and kv_mix is None else None
    for name, value in (("input-len", input_len), ("output-len", output_len)):
        positive_int(name, value)
    finite_non_negative("price-per-hour", price_per_hour)
    operating = operating_from(batch, input_len, output_len, ttft_ms, tpot_ms, 1)
    measured = load_cost_table(cost_table)
    tgt = get_target(target)
    spec = resolve_config(model, command="estimate")
    routing = read_routing(spec, routing_file) if routing_file else Routing.uniform(spec)

    baseline: Choice | None = None  # the runtime's uncompressed format, once it is known

    def model_for(workload: Workload, kv: KvFormat | None = None) -> CostModel:
        return CostModel(spec, tgt, workload, price_per_hour=price_per_hour, measured=measured,
                         kv=kv, routing=routing, baseline=baseline)

    try:
        probe = model_for(Workload(batch=1, input_len=input_len, output_len=output_len))
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = str(first['loc'][0]).replace('_', '-')
        raise UserInputError(f"--{flag}: {first['msg']}") from None
    if precision:
        choice = Choice(Sparsity.parse(sparsity), Precision.parse(precision))
    else:  # no compression asked: the runtime's own uncompressed format
        choice = Choice(Sparsity.parse(sparsity), _runtime_baseline(
            tgt, runtime or default_runtime(tgt), probe.baseline).precision)
    runtime, support = _pick_runtime(tgt, runtime, choice)
    if not support.ok:
        raise UnsupportedFormatError(support.reason)
    baseline = _runtime_baseline(tgt, runtime, probe.baseline)
    measured = _kept_embedding(measured, model, runtime)  # model_for reads it from here on
    kv_base = default_kv(tgt, runtime)
    if kv_mix is not None:
        kv_asked = kv_of_mix(runtime, kv_mix, spec.n_layers, kv_base)
    kv_cand = kv_asked or kv_base
    kv_ok = kv_supports(tgt, runtime, kv_cand)
    if not kv_ok.ok:
        raise UnsupportedFormatError(f"--kv-cache {kv_cand.value}: {kv_ok.reason}")
    label = str(choice) if kv_asked is None else f"{choice}, KV {kv_cand.value}"
    expert_choice, why = routed_expert_choice(spec, tgt, runtime, choice, baseline)
    uniform = uniform_with_experts(spec, choice, expert_choice)
    experts = {} if uniform is choice else {"routed_experts": str(expert_choice)}
    if experts:
        label = f"{label} (experts {expert_choice})"
        err_console.print(f"note: routed experts stay {expert_choice}: {why}")
    cand_model = lambda w: model_for(w, kv_cand)  # noqa: E731
    base_model = lambda w: model_for(w, kv_base)  # noqa: E731
    points: dict[str, OperatingPoint] = {
        "candidate": resolve_operating_point(spec, tgt, uniform, operating, model_for=cand_model)}
    cand = cand_model(points["candidate"].workload).evaluate(uniform)
    # The baseline never blocks the candidate: one that does not fit (or meets no SLO) at
    # any batch is a column saying so, with its bytes at batch 1.
    base_status, base_reason = None, ""
    try:
        points["baseline"] = resolve_operating_point(spec, tgt, None, operating,
                                                     model_for=base_model)
        base = base_model(points["baseline"].workload).evaluate(None)
    except NoOperatingPoint as exc:
        base_status = "does not fit" if exc.needed_bytes is not None else "misses the SLO"
        base_reason = (f"at batch 1 it needs {exc.needed_bytes / 1e9:,.2f} GB but "
                       f"{exc.usable_bytes / 1e9:,.2f} GB is usable on {tgt.name}"
                       if exc.needed_bytes is not None and exc.usable_bytes is not None
                       else str(exc).split(": relax")[0])
        base = base_model(Workload(batch=1, input_len=input_len,
                                   output_len=output_len)).evaluate(None)
    if base_status is None and not base.memory.fits:  # a fixed batch it cannot hold
        base_status = "does not fit"
        base_reason = (f"at batch {base.workload['batch']} it needs "
                       f"{base.memory.total_bytes / 1e9:,.2f} GB but "
                       f"{base.memory.capacity_bytes / 1e9:,.2f} GB is usable on {tgt.name}")
    if operating.mode != "fixed":
        for side, point in points.items():
            err_console.print(f"{side}: {point.detail}")
    if problem := spec.context_problem(input_len + output_len):  # printed once it stands
        err_console.print(f"warning: {problem}")
    if not cand.memory.fits:
        err_console.print(f"warning: {choice} needs {cand.memory.total_bytes / 1e9:,.1f} GB, "
                          f"more than the {cand.memory.capacity_bytes / 1e9:,.0f} GB usable "
                          f"on {tgt.name}")
    if base_status:
        err_console.print(f"baseline {base.baseline} {base_status}: {base_reason}")
    if as_json:
        base_doc = base.to_json() | ({"status": base_status, "reason": base_reason}
                                     if base_status else {"status": "ok"})
        doc = {"predicted": True, "runtime": runtime, "choice": str(choice), **experts,
               **({"routing": routing.source} if spec.moe else {}),
               "kv_cache": kv_cand.value, "baseline_kv_cache": kv_base.value,
               "candidate": cand.to_json(), "baseline": base_doc,
               "speedup": {} if base_status else _speedups(cand, base),
               "operating_point": {k: p.to_json() for k, p in points.items()}}
        if base_status:
            doc["operating_point"]["baseline"] = {"mode": operating.mode, "status": base_status,
                                                  "detail": base_reason}
        if not breakdown:
            for side in ("candidate", "baseline"):
                doc[side].pop("layers")
                doc[side]["kv"].pop("blocks")
        emit_json(doc)
        return
    console.print(_summary(cand, base, label, runtime, base_status))
    if spec.moe:  # what sets the experts a step reads (--routing names a measured one)
        console.print(f"expert routing: {routing.source}"
                      + ("" if routing_file else " (top_k / E per expert; --routing FILE "
                         "takes a plan's or profile's calibration routing)"))
    if breakdown:
        console.print(_breakdown(cand))
        console.print(_kv_breakdown(cand))
