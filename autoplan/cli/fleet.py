"""`autoplan fleet`: nodes, $/month and $/1M tokens to serve a request rate under a p99 SLA,
baseline vs plan, with every step of the arithmetic shown (autoplan/fleet.py)."""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich.table import Table

from autoplan.backends.registry import resolve_target as get_target
from autoplan.cli._args import positive_int
from autoplan.cli._output import console, emit_json, err_console, json_option
from autoplan.cli._workload_options import operating_from, workload_options
from autoplan.cost import CostModel, resolve_config
from autoplan.cost.model import USABLE_MEMORY
from autoplan.cost.moe import Routing
from autoplan.cost.operating import NoOperatingPoint, resolve_operating_point
from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.fleet import FleetSizing, ReplicaDoesNotFit, does_not_fit, size_fleet
from autoplan.fleet_measured import (
    MeasuredCurves,
    MeasuredSizing,
    check_curve_applies,
    read_capacity_curves,
    size_fleet_measured,
)
from autoplan.formats import Choice
from autoplan.formats.kv import KvFormat
from autoplan.nodes import NodeLayout, node_layout
from autoplan.plan.io import PlanInput, read_plan
from autoplan.plan.schema import Predicted
from autoplan.runtimes import (default_kv, default_runtime, get_runtime, installed_version,
                               kv_supports, refused_layers, version_on)
from autoplan.search import load_space_file
from autoplan.targets import Target
from autoplan.workload import Workload


def _size(cm: CostModel, decisions, workload: Workload, qps: float, p99_s: float,
          max_replicas: int | None, layout: NodeLayout,
          planned: Predicted | None = None, weight_gb: float | None = None) -> FleetSizing:
    """One side's fleet; `planned`: the plan's own prediction of this side at this target and
    workload, whose TTFT and TPOT it keeps (a `local` search times the machine's kernels,
    which the cost model here has not); `weight_gb`: the plan's own weights of this side (a
    GGUF export keeps the source's embedding, cost/model.py), which no workload or machine
    changes."""
    est = cm.evaluate(decisions)
    tokens = workload.batch * (workload.input_len + workload.output_len)
    ttft, tpot = (planned.ttft_s, planned.tpot_s) if planned else (est.metrics.ttft_s,
                                                                   est.metrics.tpot_s)
    weights = weight_gb * 1e9 if weight_gb is not None else est.memory.weights_bytes
    return size_fleet(
        weight_bytes=weights,
        kv_bytes_per_token=est.memory.kv_cache_bytes / tokens,
        node_memory_bytes=cm.target.memory_bytes, batch=workload.batch,
        input_len=workload.input_len, output_len=workload.output_len,
        ttft_s=ttft, tpot_s=tpot, qps=qps, p99_s=p99_s,
        price_per_hour=layout.node_price_per_hour, usable_fraction=USABLE_MEMORY,
        max_replicas=max_replicas, domains=layout.domains,
        workspace_bytes=est.memory.workspace_bytes)


def _steps_table(title: str, sizing: FleetSizing | MeasuredSizing) -> Table:
    table = Table(title=title)
    for col in ("step", "arithmetic", "value"):
        table.add_column(col, justify="right" if col == "value" else "left", overflow="fold")
    for s in sizing.steps:
        table.add_row(s.label, s.formula, f"{s.value:,.6g} {s.unit}".strip())
    if sizing.reason:
        table.add_row("[red]infeasible[/red]", sizing.reason, "-")
    return table


def _lengths(measured: MeasuredCurves | None, input_len: int | None,
             output_len: int | None, planned: Workload | None) -> tuple[int, int]:
    """The workload: the measured one when sizing from a measurement (a curve says nothing
    about other lengths), else the given lengths, else the plan's (what its predictions and
    deploy command assumed), else 512 / 128."""
    if measured is None:
        default_in, default_out = ((planned.input_len, planned.output_len) if planned
                                   else (512, 128))
        return (default_in if input_len is None else input_len,
                default_out if output_len is None else output_len)
    for flag, given, have in (("input-len", input_len, measured.input_len),
                              ("output-len", output_len, measured.output_len)):
        if given is not None and given != have:
            raise UserInputError(f"--{flag} {given} differs from the measured workload's {have}"
                                 f": drop --{flag} or measure at {given}")
    return measured.input_len, measured.output_len


def _measured_sides(measured: MeasuredCurves, given: str | None) -> dict[str, str]:
    """{"baseline": side name, "plan": side name} in the measured result."""
    names = list(measured.sides)
    if given:
        parts = [x.strip() for x in given.split(",")]
        if len(parts) != 2 or not all(parts):
            raise UserInputError(f"--measured-sides takes BASE,PLAN, got '{given}'")
        for part in parts:
            measured.side(part)
        return {"baseline": parts[0], "plan": parts[1]}
    base = next((n for n in ("baseline", "original") if n in names), None)
    plan = "plan" if "plan" in names else next((n for n in names if n.startswith("plan")), None)
    if base is None or plan is None:
        raise UserInputError(f"cannot tell the baseline and plan sides among "
                             f"{', '.join(names)}: pass --measured-sides BASE,PLAN")
    return {"baseline": base, "plan": plan}


def _print_measured(before: FleetSizing, after: FleetSizing, sized: dict[str, MeasuredSizing],
                    curves: dict[str, str], measured: MeasuredCurves, qps: float,
                    p99_ms: float) -> None:
    for side, m in sized.items():
        console.print(_steps_table(f"{side} measured ('{curves[side]}', {measured.source})", m))
    summary = Table(title=f"fleet for {qps:g} req/s, p99 <= {p99_ms:g} ms: analytic (cost "
                          "model, M/M/k) vs measured capacity curve")
    for col in ("", "baseline analytic", "baseline measured", "plan analytic", "plan measured"):
        summary.add_column(col, justify="right")
    mb, mp = sized["baseline"], sized["plan"]

    def cap(s: FleetSizing) -> float | None:
        tok = _value(s, "node_throughput_tok_s")
        return None if tok is None else tok / max(measured.output_len, 1)

    rows = (("node req/s (analytic: saturated; measured: at the SLA)", cap(before),
             mb.node_capacity_rps, cap(after), mp.node_capacity_rps, ",.3f"),
            ("node throughput tok/s", _value(before, "node_throughput_tok_s"),
             mb.node_throughput_tok_s, after.node_throughput_tok_s, mp.node_throughput_tok_s,
             ",.1f"),
            ("nodes", before.nodes, mb.nodes, after.nodes, mp.nodes, "d"),
            ("p99 latency s", before.p99_s, mb.p99_s, after.p99_s, mp.p99_s, ".3f"),
            ("utilization", before.utilization, mb.utilization, after.utilization,
             mp.utilization, ".1%"),
            ("$/month", before.usd_per_month, mb.usd_per_month, after.usd_per_month,
             mp.usd_per_month, ",.0f"),
            ("$/1M output tokens at this qps", before.usd_per_million_tokens,
             mb.usd_per_million_tokens,
             after.usd_per_million_tokens, mp.usd_per_million_tokens, ",.4f"))
    for label, *values, spec in rows:
        summary.add_row(label, *(_fmt(v, spec) for v in values))
    console.print(summary)


def _node_runtime(plan: PlanInput, node: Target, measured: MeasuredCurves | None
                  ) -> tuple[str, list[str]]:
    """The runtime the node serves the plan with (the plan's when it runs on the node's
    platform; a measured curve's engine for a plan that names none; else the node's
    default) and notes saying where the plan was searched, when that is elsewhere.

    Raises:
        UnsupportedFormatError: a planned format that runtime cannot run on the node.
    """
    planned = plan.full.runtime.name if plan.full is not None else None
    if planned and node.platform in get_runtime(planned).platforms:
        runtime = planned
    elif planned is None and measured is not None and measured.engine:
        runtime = measured.engine
    else:
        runtime = default_runtime(node)
    notes = []
    searched = plan.target
    try:
        searched = get_target(searched).name if searched else None
    except UserInputError:
        pass  # an unknown name is shown as written
    if searched and searched != node.name:
        notes.append(f"the plan was searched for {searched}, not {node.name}: its choices "
                     f"were ranked on {searched}'s costs; re-plan with --target {node.name}")
    if planned and planned != runtime:
        notes.append(f"the plan was searched for {planned}, which does not run on "
                     f"{node.name} ({node.platform}); sized for {runtime} instead")
    refused = refused_layers(node, runtime, plan.decisions)
    if refused:
        raise UnsupportedFormatError(
            f"{runtime} {version_on(node, runtime)} cannot run {refused}: re-plan with "
            f"`autoplan search --target {node.name}`")
    return runtime, notes


def _kv_formats(plan: PlanInput, node: Target, runtime: str) -> tuple[KvFormat, KvFormat]:
    """(baseline, plan) KV-cache formats: the runtime's own cache on the node, and the plan's
    where it chose one over its runtime's own (a plan keeping its runtime's cache keeps the
    node runtime's: bf16 in vLLM on an H100 is fp32 in ONNX Runtime on a CPU).

    Raises:
        UnsupportedFormatError: the cache the plan chose is one the runtime does not serve
            on the node.
    """
    own = default_kv(node, runtime)
    record = plan.full.kv_cache if plan.full is not None else None
    chose = record is not None and record.format != record.default
    planned = KvFormat.parse(record.format) if chose else own
    answer = kv_supports(node, runtime, planned)
    if not answer.ok:
        raise UnsupportedFormatError(f"the plan's KV cache {planned.value}: {answer.reason}; "
                                     f"re-plan with `autoplan search --target {node.name}`")
    return own, planned


def _other_machine(searched: str | None, here: str | None) -> str:
    """Why a `local` plan's timed TTFT and TPOT are not this machine's."""
    then = "sized with the cost model's times, not the plan's timed ones"
    if searched is None:
        return f"the plan does not record the machine it was searched on: {then}"
    if here and searched.startswith(f"{here}; "):  # this machine, fewer threads
        return (f"the plan's kernels were {searched.removeprefix(f'{here}; ')}, not on this "
                f"machine's {here.rsplit(', ', 1)[-1]}: {then}")
    return f"the plan was searched on {searched}, not on this machine ({here}): {then}"


def _plans_model(plan: PlanInput, model: str | None) -> bool:
    """Whether --model is the plan's own model: its name, or a folder whose weights have
    the content hash the plan records (a plan searched on a local folder names only it)."""
    if model is None or model == plan.model_id:
        return True
    if plan.full is None:
        return False
    from autoplan.models.hashing import content_hash_of

    try:
        return content_hash_of(model) == plan.full.model.content_hash
    except AutoplanError:  # not a model argument resolve_config takes either: it says why
        return False


def _version_here(node: Target, runtime: str) -> tuple[str, str | None]:
    """The runtime's version as fleet prints it, and a note when it is not this machine's:
    on a measured node (`local`) an engine in its own venv reports its installed packages;
    one not installed here is sized at the catalog's version, which the note says."""
    version = version_on(node, runtime)
    if not node.measured or installed_version(runtime) is not None:
        return version, None
    from autoplan.engines import engine_names, engine_status, get_engine

    if runtime not in engine_names():
        return version, None
    status = engine_status(runtime)
    if status.installed and status.source == "env":  # a Python named by the override
        return f"{version} (the catalog's; the engine is {status.detail})", None
    if status.installed:
        return f"{version} (installed: {status.detail or 'versions not recorded'})", None
    return version, (f"{runtime} is not installed here: sized as the catalog's {runtime} "
                     f"{version} (`{get_engine(runtime).install_command}` installs it)")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _value(sizing: FleetSizing, attr: str):  # noqa: ANN202 - a figure or None
    """A figure of an analytic sizing; None (shown "-") for a side that does not fit."""
    return None if sizing.reason.startswith("does not fit") else getattr(sizing, attr)


def _unfit_reason(exc: NoOperatingPoint | ReplicaDoesNotFit, node: str) -> str:
    """Why a side cannot run on the node, with its bytes."""
    if exc.needed_bytes is None or exc.usable_bytes is None:
        return str(exc).split(": relax")[0]
    where = "at batch 1 " if isinstance(exc, NoOperatingPoint) else "one replica "
    return (f"{where}needs {exc.needed_bytes / 1e9:,.2f} GB but {exc.usable_bytes / 1e9:,.2f} "
            f"GB is usable on {node}")


def _check_args(*, qps: float, p99_ms: float, input_len: int, output_len: int,
                max_replicas: int) -> None:
    """One line naming the first bad flag, before the plan or the model is read."""
    for flag, value in (("qps", qps), ("p99-ms", p99_ms)):
        if not 0 < value < math.inf:  # also False for NaN
            raise UserInputError(f"--{flag} must be a finite number > 0, got {value}")
    for flag, count in (("input-len", input_len), ("output-len", output_len)):
        positive_int(flag, count)
    if max_replicas < 0:
        raise UserInputError(f"--max-replicas must be >= 0 (0: as many as memory allows), "
                             f"got {max_replicas}")


@click.command("fleet")
@click.option("--plan", "plan_path", required=True, help="Plan JSON (full or minimal).")
@click.option("--model", default=None, help="Model (default: the plan's).")
@click.option("--node", required=True, help="Node target, e.g. xeon-8480 or h100.")
@click.option("--qps", type=float, required=True, help="Requests per second, whole fleet.")
@workload_options(1, "Sequences one replica decodes together.",
                  lengths_from="the --measured workload's, or the plan's",
                  batch_default="the plan's batch, else 1")
@click.option("--p99-ms", type=float, required=True, help="p99 request-latency SLA, ms.")
@click.option("--max-replicas", type=int, default=1, show_default=True,
              help="Model copies per memory domain (0: as many as memory allows).")
@click.option("--layout", default=None,
              help="CPU nodes: socket (default: one replica per socket, pinned) | spanning "
                   "(one replica over all sockets, weights local to their threads) | "
                   "interleaved (one replica, memory interleaved).")
@click.option("--measured", "measured_path", default=None,
              help="A serving benchmark's result (benchmarks/serve_bench.py or "
                   "llamacpp_serve.py JSON): also size from its measured capacity curves, "
                   "side by side with the analytic queue. --node should be the machine it "
                   "was measured on (its price is used).")
@click.option("--measured-sides", default=None,
              help="BASE,PLAN: the result's sides to read [default: baseline (or original) "
                   "and plan (or the first plan*)].")
@json_option
def command(plan_path: str, model: str | None, node: str, qps: float, input_len: int | None,
            output_len: int | None, batch: str | None, ttft_ms: float | None,
            tpot_ms: float | None, p99_ms: float, max_replicas: int, layout: str | None,
            measured_path: str | None, measured_sides: str | None, as_json: bool) -> None:
    """Size a fleet for a plan and its baseline on one node type, showing the arithmetic.

    With `--batch max` or `--ttft-ms/--tpot-ms` each side runs at its own operating point on
    one replica's share of the node (a smaller plan fits, or meets the SLO at, a larger batch).
    With `--measured` the fleet is also sized from a serving benchmark's capacity curves.
    """
    measured = read_capacity_curves(measured_path) if measured_path else None
    plan = read_plan(plan_path)
    planned = plan.full.workload if plan.full else None
    input_len, output_len = _lengths(measured, input_len, output_len, planned)
    _check_args(qps=qps, p99_ms=p99_ms, input_len=input_len, output_len=output_len,
                max_replicas=max_replicas)
    operating = operating_from(batch, input_len, output_len, ttft_ms, tpot_ms,
                               planned.batch if planned else 1)
    curves = _measured_sides(measured, measured_sides) if measured else None
    named = model is None  # the plan's name: a bundled model, or a folder's name alone
    if not (model or plan.model_id):
        raise UserInputError("this plan does not name its model: pass --model")
    target = get_target(node)
    # the plan's predictions are its model's; they are used only on its own target, so the
    # weights are hashed (a read of the whole checkpoint when not cached) only there
    own_model = (plan.full is not None and plan.full.target.name == target.name
                 and _plans_model(plan, model))
    model = model or plan.model_id
    lay = node_layout(target, layout)
    runtime, notes = _node_runtime(plan, target, measured)
    kv = dict(zip(("baseline", "plan"), _kv_formats(plan, target, runtime)))
    if (plan.full is not None and plan.full.target.name == target.name
            and plan.full.target.machine != target.machine):  # `local`: not this machine's
        notes.append(_other_machine(plan.full.target.machine, target.machine))
    if measured:
        check_curve_applies(measured, target, runtime)
    # The "before" is what the search compares plans against on this platform (its search
    # space's baseline: fp32 on CPUs, bf16 on GPUs), not the fastest dtype the node has.
    base = Choice.parse(load_space_file(target.platform).baseline)
    try:
        spec = resolve_config(model)
    except UserInputError as exc:
        if not named:
            raise
        # a plan searched on a local folder records its name, which no config answers to
        raise UserInputError(f"the plan's model '{model}' is not a bundled name or a path "
                             "here: pass --model with its folder or config.json") from exc
    # an MoE plan's predictions assumed its calibration routing: both sides are sized with it
    routing = Routing.from_json(spec, plan.full.routing if plan.full else None)

    def model_for(w: Workload, side: str) -> CostModel:
        return CostModel(spec, lay.target, w, baseline=base, routing=routing, kv=kv[side])

    cap = max_replicas or None
    sides = {"baseline": {layer.name: base for layer in spec.layers}, "plan": plan.decisions}
    sized: dict[str, FleetSizing] = {}
    points = {}
    unfit: dict[str, str] = {}
    for side, decisions in sides.items():
        try:
            points[side] = resolve_operating_point(
                spec, lay.target, decisions, operating,
                model_for=lambda w, side=side: model_for(w, side))
            w = points[side].workload
            # the plan's own prediction of this side: the plan's model on the plan's own
            # target (a GPU, or one socket of a CPU node: not a replica spanning sockets; for
            # `local`, the same machine), at the plan's workload, with a batch not chosen by
            # an SLO on the cost model's times
            mine = plan.full.predicted.get(side) if own_model else None
            own = (mine if mine is not None and lay.target is target
                   and plan.full.target.machine == target.machine
                   and operating.mode != "slo" and plan.full.workload == w else None)
            sized[side] = _size(model_for(w, side), decisions, w, qps, p99_ms / 1e3, cap, lay,
                                own, mine.weight_gb if mine is not None else None)
        except (NoOperatingPoint, ReplicaDoesNotFit) as exc:
            if side == "plan":
                raise
            # the baseline never blocks the plan: it is a column saying why it cannot run
            unfit[side] = _unfit_reason(exc, lay.target.name)
            sized[side] = does_not_fit(unfit[side])
    before, after = sized["baseline"], sized["plan"]
    # a measured curve is one machine's: its node price, one replica per benchmark server
    measured_sized = {side: size_fleet_measured(measured.side(name), qps=qps,
                                                p99_s=p99_ms / 1e3, output_len=output_len,
                                                price_per_hour=lay.node_price_per_hour)
                      for side, name in curves.items()} if curves else {}
    version, unverified = _version_here(target, runtime)
    notes += [unverified] if unverified else []
    for note in notes:
        err_console.print(f"note: {note}")
    if as_json:
        doc = {"predicted": True, "node": target.name, "qps": qps, "p99_sla_s": p99_ms / 1e3,
               "runtime": {"name": runtime, "version": version},
               "searched_for": {"target": plan.target, "runtime": plan.full.runtime.name
                                if plan.full is not None else None},
               "notes": notes, "layout": lay.to_json(),
               "kv_cache": {side: k.value for side, k in kv.items()},
               "workload": points["plan"].workload.model_dump(),
               "operating_point": {k: p.to_json() for k, p in points.items()}
               | {k: {"mode": operating.mode, "status": "does not fit", "detail": why}
                  for k, why in unfit.items()},
               "baseline": before.to_json(), "plan": after.to_json()}
        if measured_sized:
            doc["measured"] = {"source": measured.source, "file": Path(measured_path).name,
                               "sides": curves,
                               **{side: m.to_json() for side, m in measured_sized.items()}}
        emit_json(doc)
        return
    console.print(f"node: {target.name}, {runtime} {version}, layout {lay.name} ({lay.domains} "
                  f"memory domain{'s' if lay.domains > 1 else ''}, "
                  f"${lay.node_price_per_hour:,.2f}/h per node); the runtime must: "
                  f"{lay.runtime_must}")
    if operating.mode != "fixed":
        for side, point in points.items():
            console.print(f"{side}: {point.detail}")
    for side, why in unfit.items():
        console.print(f"{side} {base} on {target.name}: {why}")
    console.print(_steps_table(f"baseline {base}, KV {kv['baseline'].value} on {target.name}",
                               before))
    console.print(_steps_table(f"plan, KV {kv['plan'].value} on {target.name}", after))
    if measured_sized:
        _print_measured(before, after, measured_sized, curves, measured, qps, p99_ms)
        return
    summary = Table(title=f"fleet for {qps:g} req/s, p99 <= {p99_ms:g} ms (predicted service "
                          "times, M/M/k queueing)")
    for col in ("", "baseline (does not fit)" if unfit else "baseline", "plan"):
        summary.add_column(col, justify="right")
    rows = (("replicas per node", "replicas_per_node", "d"),
            ("node throughput tok/s", "node_throughput_tok_s", ",.1f"),
            ("nodes", "nodes", "d"), ("p99 latency s", "p99_s", ".3f"),
            ("utilization", "utilization", ".1%"), ("$/month", "usd_per_month", ",.0f"),
            ("$/1M output tokens at this qps", "usd_per_million_tokens", ",.4f"))
    for label, attr, spec in rows:
        summary.add_row(label, _fmt(_value(before, attr), spec), _fmt(_value(after, attr), spec))
    console.print(summary)


__all__ = ["command"]
