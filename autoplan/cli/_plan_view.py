"""Rendering a plan for people: the summary table (plan vs baseline vs best uniform) and
the per-layer decisions."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table

from autoplan.modelspec import part_of

if TYPE_CHECKING:
    from autoplan.plan.schema import Plan

_ROWS = (
    ("output tokens/s (predicted)", "tokens_per_s", "{:,.1f}"),
    ("TTFT ms (predicted)", "ttft_s", "{:,.2f}", 1e3),
    ("TPOT ms (predicted)", "tpot_s", "{:,.3f}", 1e3),
    ("memory GB (predicted)", "memory_gb", "{:,.3f}"),
    ("weights GB", "weight_gb", "{:,.3f}"),
    ("  active weights GB read per token", "active_weight_gb", "{:,.3f}"),
    ("energy J/token (predicted)", "energy_j_per_token", "{:,.5f}"),
    ("$ / 1M tokens (predicted)", "usd_per_1m_tokens", "{:,.4f}"),
)


def summary_table(plan: Plan) -> Table:
    w = plan.workload
    table = Table(title=f"{plan.model.id} on {plan.target.shown} ({plan.runtime.name} "
                        f"{plan.runtime.version}), batch {w.batch}, {w.input_len} in / "
                        f"{w.output_len} out, objective {plan.objective}"
                        + (f" ({plan.operating_point.detail})" if plan.operating_point else ""))
    cols = [k for k in ("plan", "baseline", "best_uniform") if k in plan.predicted]
    table.add_column("metric")
    for k in cols:
        label = plan.predicted[k].label if k == "best_uniform" else k
        table.add_column(label, justify="right")
    for row in _ROWS:
        label, attr, fmt = row[:3]
        scale = row[3] if len(row) > 3 else 1.0
        values = [getattr(plan.predicted[k], attr) for k in cols]
        if any(v is None for v in values):  # a plan from before the field existed
            continue
        if attr == "active_weight_gb" and not any(".experts." in n for n in plan.decisions):
            continue  # a dense model: every token reads (nearly) every weight
        table.add_row(label, *[fmt.format(v * scale) for v in values])
    q = plan.quality
    uniform_kl = plan.search.best_uniform_kl
    extra = [f"{uniform_kl:.5f}" if uniform_kl is not None else "-"] if len(cols) > 2 else []
    table.add_row("batch (concurrent sequences)",
                  *[f"{plan.workload.batch:,}" if k == "plan" else "" for k in cols])
    # quality is measured against the model as is: the baseline itself, unless the source
    # is quantized (a GGUF), whose "as is" candidate is the reference and the baseline (its
    # dequantization) was not measured
    as_is = any(point.kind == "as-is" for point in plan.search.points)
    table.add_row("KL to original (measured)", f"{q.kl:.5f}", "-" if as_is else "0", *extra)
    table.add_row("perplexity (measured)", f"{q.ppl:.3f}", "-" if as_is else f"{q.ppl_ref:.3f}",
                  *(["-"] if len(cols) > 2 else []))
    return table


_PARTS = ("attention", "mlp", "shared_expert", "routed_experts", "lm_head")


def decisions_table(plan: Plan) -> Table:
    """Decisions by part of the model (attention / MLP / shared / routed experts / lm_head):
    how many layers (and, for routed experts, how many blocks' expert groups) per choice."""
    counts: Counter = Counter()
    blocks: dict[tuple[str, str], set[str]] = {}
    for name, choice in plan.decisions.items():
        part = part_of(name)
        counts[(part, choice)] += 1
        if part == "routed_experts":
            blocks.setdefault((part, choice), set()).add(name.split(".experts.")[0])
    moe = any(part == "routed_experts" for part, _ in counts)
    table = Table(title="decisions by part")
    table.add_column("part")
    table.add_column("choice")
    table.add_column("layers", justify="right")
    if moe:
        table.add_column("expert groups", justify="right")
    order = {p: i for i, p in enumerate(_PARTS)}
    for (part, choice), n in sorted(counts.items(), key=lambda kv: (order[kv[0][0]], -kv[1])):
        row = [part.replace("_", " "), choice, str(n)]
        if moe:
            group = blocks.get((part, choice))
            row.append(str(len(group)) if group else "-")
        table.add_row(*row)
    return table


def _quality_lines(plan: Plan) -> list[str]:
    """Per-slice KL, gate scores and the recovery pass, when the plan has them."""
    q, out = plan.quality, []
    if q.slices:  # in the slices' own order (the plan's JSON sorts its keys)
        from autoplan.search.verify import SLICE_NAMES

        rank = {n: i for i, n in enumerate(SLICE_NAMES)}
        out.append("KL per slice (measured): " + ", ".join(
            f"{k} {q.slices[k]:.5f}" for k in sorted(q.slices, key=lambda k: rank.get(k, 99))))
    for name, g in q.gates.items():
        out.append(f"{name}: {g.score:.2f} points (original {g.reference:.2f}, "
                   f"{g.score - g.reference:+.2f})")
    if plan.budget.also:
        out.append("further budgets: " + ", ".join(plan.budget.also))
    r = plan.recovery
    if r is not None:
        line = (f"recovery: {r.method}, {r.steps_run} steps ({r.layers} layers), KL "
                f"{r.unrecovered.kl:.5f} -> {q.kl:.5f}; loss {r.loss_first:.4f} -> "
                f"{r.loss_last:.4f}; {r.seconds:.0f} s wall, {r.cpu_seconds:.0f} s CPU; "
                f"weights {r.weights_file}")
        if r.adapter_kl is not None:
            line += f"; unmerged adapter KL {r.adapter_kl:.5f}"
        out.append(line)
    return out


def kv_lines(plan: Plan) -> list[str]:
    """The plan's KV cache, the caches the search compared it with, and its KL on long
    prompts."""
    kv, out = plan.kv_cache, []
    if kv is None:
        return out
    rounding = f", queries rounded to {kv.query}" if kv.query else ""
    out.append(f"KV cache: {kv.format} (engine flag {kv.flag}; runtime's own {kv.default}); "
               f"{kv.bytes_per_token / 1024:,.2f} KiB per token, "
               f"{kv.bytes_per_sequence / 2**20:,.2f} MiB per sequence; scales: {kv.scales}"
               f"{rounding}; one type for every layer")
    if plan.quality.kl_long is not None:
        out.append(f"KL short / long prompts (measured): {plan.quality.kl:.5f} / "
                   f"{plan.quality.kl_long:.5f} ({kv.long_split_tokens}-token blocks)")
    for a in kv.alternatives:
        kl = "-" if a.measured_kl is None else f"{a.measured_kl:.5f}"
        long = "" if a.kl_long is None else f", long {a.kl_long:.5f}"
        out.append(f"  tried KV {a.format}: batch {a.batch:,}, objective {a.objective:,.4g} "
                   f"(predicted), KL {kl}{long}, {'passed' if a.passed else 'FAILED'}"
                   + ("  <- planned" if a.format == kv.format else ""))
    return out


def deploy_lines(plan: Plan) -> list[str]:
    """What an operator pastes to serve the exported artifact."""
    d = plan.deploy
    if d is None:
        return []
    if not d.command:
        return [f"deploy ({d.runtime}): {d.note}"]
    out = [f"deploy ({d.runtime}, batch {d.settings.get('batch')}, context "
           f"{d.settings.get('max_model_len')}):", f"  {d.shell}"]
    out += [f"  file {name}:\n" + "".join(f"    {x}\n" for x in text.splitlines())
            for name, text in d.files.items()]
    if d.note:
        out.append(f"  ({d.note}; {{MODEL}}: the folder or file `autoplan export` writes)")
    return out


def render(plan: Plan) -> Group:
    s = plan.search
    lines = [summary_table(plan), decisions_table(plan)]
    cert = s.certificate
    text = [f"budget {plan.budget.text}: measured "
            f"{'MET' if plan.quality.budget_met else 'NOT MET'} "
            f"(KL {plan.quality.kl:.5f}, surrogate predicted {plan.quality.surrogate_kl:.5f})",
            f"outcome: {s.outcome}; {s.trials} surrogate trials, {s.real_evaluations} real "
            f"evaluations, {s.wall_time_s:.1f} s; sampler {s.sampler}, seed {s.seed}"]
    if cert:
        # objectives differ by orders of magnitude (tok/s, seconds per token): 5 digits each
        text.append(f"certificate: exact optimum of the surrogate problem "
                    f"{cert.optimum_objective:,.5g} ({plan.objective}), search "
                    f"{cert.search_objective:,.5g}, gap {cert.gap * 100:.3f}%")
    text += _quality_lines(plan) + kv_lines(plan) + deploy_lines(plan)
    if s.gain_over_best_uniform:
        text.append(f"predicted gain over best uniform recipe ({s.best_uniform}): "
                    f"{s.gain_over_best_uniform:.3f}x "
                    f"{'decode tokens/s' if plan.objective == 'tpot' else 'tokens/s'}")
    if s.why:
        text.append(f"why this plan: {s.why}")
    if s.stopped:
        text.append(f"search stopped: {s.stopped}")
    return Group(*lines, *text)


__all__ = ["decisions_table", "deploy_lines", "kv_lines", "render", "summary_table"]
