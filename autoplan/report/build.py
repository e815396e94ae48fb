"""`autoplan report`: one self-contained HTML file for a plan or a compare folder.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.atomic import check_writable_dir, write_text_atomic
from autoplan.errors import AutoplanError, UserInputError
from autoplan.plan.io import load_plan
from autoplan.plan.schema import Plan
from autoplan.report import figures
from autoplan.runtimes import summarize_refused

COMPARE_FILE = "compare.json"
_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;
padding:3px 7px;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{
text-align:left}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}
.note{color:#666;font-size:13px}section{border-top:2px solid #ddd;margin-top:2em}"""
_SCRIPT = """window.addEventListener('error',function(e){var b=document.body;
b.dataset.errors=(b.dataset.errors||'')+String(e.message)+';'});
window.addEventListener('load',function(){var imgs=document.querySelectorAll('figure img');
var n=0;imgs.forEach(function(i){if(i.complete&&i.naturalWidth>0){n++}});
document.body.dataset.plotsLoaded=String(n)});"""


@dataclass(frozen=True)
class Figure:
    name: str  # data-plot attribute: pareto | choice-map | cost-breakdown | compare
    caption: str
    png: bytes


def _img(fig: Figure) -> str:
    data = base64.b64encode(fig.png).decode()
    return (f'<figure data-plot="{fig.name}"><img alt="{html.escape(fig.caption)}" '
            f'src="data:image/png;base64,{data}"><figcaption class="note">'
            f"{html.escape(fig.caption)}</figcaption></figure>")


def _per_token(plan: Plan) -> int | None:
    """Experts each token is routed to in the plan's model, from its routing (each token
    picks top_k experts, so a block's shares sum to top_k); None for a dense plan."""
    shares = (plan.routing or {}).get("shares") or {}
    return round(sum(next(iter(shares.values())))) if shares else None


def _shape(model_type: str, blocks: int, params: int, per_token: int | None) -> str:
    routed = f", {per_token} experts per token" if per_token else ""
    return f"{model_type}, {blocks} blocks, {params:,} parameters{routed}"


def check_model(plans: list[Plan], model: str) -> None:
    """Refuse a --model that is not the plans' model, before anything is drawn: its config
    would draw another model's per-block breakdown (a top-8 model's for a top-4 plan). The
    identity export checks, the weights' content hash; with no weights at hand (a config),
    what the plan records of the model's shape and routing (a config that agrees in them is
    taken: nothing else in the plan tells it apart).

    Raises:
        UserInputError: one line naming the fix.
    """
    from autoplan.models.hashing import content_hash_of
    from autoplan.models.loader import load_spec

    digest = content_hash_of(model)
    spec = load_spec(model) if digest is None else None
    for plan in plans:
        ref = plan.model
        if digest is not None:
            if digest == ref.content_hash:
                continue
            found = f"has content hash {digest[:12]}"
            wanted = f"{ref.id} ({ref.content_hash[:12]})"
        else:
            k = _per_token(plan)
            mine = (spec.model_type, spec.n_layers, spec.total_params,
                    spec.moe.top_k if spec.moe and k else None)
            theirs = (ref.model_type, ref.n_layers, ref.params, k)
            if mine == theirs:
                continue
            found, wanted = f"is a {_shape(*mine)}", f"{ref.id} ({_shape(*theirs)})"
        raise UserInputError(f"--model '{model}' {found} but the plan was made for {wanted}: "
                             "pass the plan's model as --model, or leave --model out")


def _estimates(plan: Plan, model: str | None):  # noqa: ANN202 - (plan, baseline) Estimates
    """The cost model's per-layer breakdown of the plan and its baseline, from the model's
    config (`model` overrides the plan's model id); None when either cannot be resolved."""
    from autoplan.backends.registry import resolve_target
    from autoplan.cost.model import CostModel
    from autoplan.cost.moe import Routing
    from autoplan.formats import Choice
    from autoplan.models.loader import load_spec
    from autoplan.search import load_space_file
    try:
        spec = load_spec(model or plan.model.id)
        target = resolve_target(plan.target.name)
    except AutoplanError:
        return None
    baseline = Choice.parse(load_space_file(target.platform).baseline)
    cm = CostModel(spec, target, plan.workload, baseline=baseline,
                   price_per_hour=plan.target.price_per_hour,
                   routing=Routing.from_json(spec, plan.routing))
    try:
        return cm.evaluate(plan.decisions), cm.evaluate(None)
    except AutoplanError:  # decisions for another model
        return None


def _summary(plan: Plan) -> str:
    rows = [("output tokens/s (predicted)", "tokens_per_s", "{:,.1f}", 1.0),
            ("TTFT ms (predicted)", "ttft_s", "{:,.2f}", 1e3),
            ("TPOT ms (predicted)", "tpot_s", "{:,.3f}", 1e3),
            ("$ / 1M tokens (predicted)", "usd_per_1m_tokens", "{:,.4f}", 1.0),
            ("J / token (predicted)", "energy_j_per_token", "{:,.5f}", 1.0),
            ("memory GB (predicted)", "memory_gb", "{:,.3f}", 1.0),
            ("weights GB", "weight_gb", "{:,.3f}", 1.0)]
    if any(".experts." in n for n in plan.decisions) and all(
            plan.predicted[k].active_weight_gb is not None for k in plan.predicted):
        rows.append(("active weights GB read per token", "active_weight_gb", "{:,.3f}", 1.0))
    cols = [k for k in ("plan", "baseline", "best_uniform") if k in plan.predicted]
    head = "".join(f"<th>{html.escape(plan.predicted[k].label)}</th>" for k in cols)
    body = "".join(
        f"<tr><td>{label}</td>" + "".join(
            f"<td>{fmt.format(getattr(plan.predicted[k], attr) * scale)}</td>" for k in cols)
        + "</tr>" for label, attr, fmt, scale in rows)
    q, w = plan.quality, plan.workload
    point = plan.operating_point.detail if plan.operating_point else f"batch {w.batch}"
    return (f"<table><tr><th>metric</th>{head}</tr>{body}</table>{_parts(plan)}"
            f"<p class='note'>measured KL {q.kl:.5f} (budget {html.escape(plan.budget.text)}, "
            f"{'met' if q.budget_met else 'NOT met'}); outcome {plan.search.outcome}; "
            f"{w.input_len} in / {w.output_len} out, {html.escape(point)}; "
            f"{html.escape(plan.search.note)}</p>")


def _parts(plan: Plan) -> str:
    """Decisions by part of the model (attention, MLP, shared expert, routed experts,
    lm_head): layers per choice."""
    from collections import Counter

    from autoplan.modelspec import part_of

    counts = Counter((part_of(n), c) for n, c in plan.decisions.items())
    order = ("attention", "mlp", "shared_expert", "routed_experts", "lm_head")
    rows = "".join(f"<tr><td>{p.replace('_', ' ')}</td><td>{html.escape(c)}</td><td>{n}</td></tr>"
                   for (p, c), n in sorted(counts.items(),
                                           key=lambda kv: (order.index(kv[0][0]), -kv[1])))
    return f"<table><tr><th>part</th><th>choice</th><th>layers</th></tr>{rows}</table>"


def plan_section(plan: Plan, title: str, model: str | None = None) -> tuple[str, int]:
    """One plan's HTML and its number of plots."""
    figs = [Figure("pareto", "objective vs KL: uniform recipes (squares), measured "
                   "candidates, the plan (star), the baseline", figures.pareto_front(plan)),
            Figure("choice-map", "choice per layer, blocks x roles", figures.choice_map(plan))]
    est = _estimates(plan, model)
    note = ""
    if est is None:
        note = ("<p class='note'>per-layer cost breakdown left out: the plan's model config "
                "or target could not be resolved here (pass --model)</p>")
    else:
        figs.append(Figure("cost-breakdown", "predicted decode time per block and role, "
                           "baseline as a line", figures.cost_breakdown(plan, *est)))
    body = "".join(_img(f) for f in figs)
    return (f"<section><h2>{html.escape(title)}</h2>{_summary(plan)}{note}{body}</section>",
            len(figs))


def _gain_cell(gain: float, name: str | None) -> str:
    """The gain over the best uniform recipe, with the recipe it is over (the model as is
    when no uniform recipe that passes is faster)."""
    label = (name or "").removeprefix("uniform ").removeprefix("dense+")
    return f"{gain:.3f}x" + (f"<br><small>{html.escape(label)}</small>" if label else "")


def _refused_cell(refused: dict[str, str]) -> str:
    """What the row's runtime cannot accelerate of what was asked for: a one-line summary,
    the formats and their reasons behind it (a details element)."""
    if not refused:
        return "-"
    items = "".join(f"<li><code>{html.escape(c)}</code>: {html.escape(why)}</li>"
                    for c, why in sorted(refused.items()))
    return (f"<details><summary>{html.escape(summarize_refused(refused))}</summary>"
            f"<ul class='refused'>{items}</ul></details>")


def _compare_table(doc: dict[str, Any]) -> str:
    head = ("<tr><th>target / runtime</th><th>batch</th><th>plan tok/s</th><th>baseline "
            "tok/s</th><th>TTFT ms</th><th>TPOT ms</th><th>$/1M tok</th><th>J/tok</th>"
            "<th>memory GB</th><th>KL (measured)</th><th>x baseline</th>"
            "<th>x best uniform (or as is)</th>"
            "<th>not accelerated</th></tr>")
    rows = []
    for r in doc["rows"]:
        name = html.escape(f"{r['target']} / {r['runtime']}")
        if r["status"] != "ok":
            rows.append(f"<tr><td>{name}</td><td colspan='12' style='text-align:left'>"
                        f"<b>{html.escape(r['status'])}</b>: {html.escape(r['reason'])}</td></tr>")
            continue
        p, b = r["plan"], r["baseline"]
        gain_u, gain_b = r.get("gain_over_best_uniform"), r.get("gain_over_baseline")
        base = (f"{b['tokens_per_s']:,.0f}" if b.get("fits", True)
                else f"does not fit ({b['memory_gb']:,.1f} GB)")
        rows.append(
            f"<tr><td>{name}</td><td>{r['batch']:,}</td><td>{p['tokens_per_s']:,.0f}</td>"
            f"<td>{base}</td><td>{p['ttft_s'] * 1e3:,.2f}</td>"
            f"<td>{p['tpot_s'] * 1e3:,.3f}</td><td>{p['usd_per_1m_tokens']:,.4f}</td>"
            f"<td>{p['energy_j_per_token']:,.4f}</td><td>{p['memory_gb']:,.2f}"
            f"{'' if p['fits'] else ' (no fit)'}</td><td>{r['kl']:.5f}</td>"
            f"<td>{'-' if gain_b is None else f'{gain_b:.3f}x'}</td>"
            f"<td>{'-' if gain_u is None else _gain_cell(gain_u, r.get('best_uniform_name'))}"
            "</td>"
            f"<td style='text-align:left'>{_refused_cell(r['not_accelerated'])}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def render_report(source: Path, model: str | None = None) -> str:
    """The HTML of a plan file or a compare folder.

    Raises:
        UserInputError: the source is neither, or a plan in it cannot be read.
    """
    parts: list[str] = []
    plots = 0
    if source.is_dir():
        index = source / COMPARE_FILE
        if not index.is_file():
            raise UserInputError(f"{source} has no {COMPARE_FILE}: pass a plan file or a folder "
                                 "written by autoplan compare")
        try:
            doc = json.loads(index.read_text())
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{index} is not JSON ({exc}): rerun autoplan compare") from None
        title = f"autoplan compare: {doc['model']}, budget {doc['budget']}"
        plans = [(r, load_plan(source / r["plan_file"])) for r in doc["rows"]
                 if r["status"] == "ok"]
        if model is not None:
            check_model([p for _, p in plans], model)
        parts.append(f"<p class='note'>ranked by {html.escape(doc['objective'])}; speed, $ and "
                     "energy are cost-model predictions, KL is measured on the compressed "
                     f"model; one sensitivity profile ({doc['profile_entries']:,} scores), "
                     f"{doc['measurements']} real-model measurements, "
                     f"{doc['reused_measurements']} shared between targets</p>")
        parts.append(_compare_table(doc))
        if any(r["status"] == "ok" for r in doc["rows"]):
            parts.append(_img(Figure("compare", "$ per 1M tokens and tokens/s per target, plan "
                                     "vs baseline", figures.compare_bars(doc["rows"]))))
            plots += 1
        for r, plan in plans:
            html_part, n = plan_section(plan, f"{r['target']} / {r['runtime']}",
                                        model or doc["model"])
            parts.append(html_part)
            plots += n
    elif source.is_file():
        plan = load_plan(source)
        if model is not None:
            check_model([plan], model)
        title = f"autoplan plan: {plan.model.id} on {plan.target.shown}"
        html_part, plots = plan_section(plan, f"{plan.target.name} / {plan.runtime.name}", model)
        parts.append(html_part)
    else:
        raise UserInputError(f"{source} does not exist: pass a plan file or a compare folder")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script>{_SCRIPT}</script></head><body data-plots='{plots}'>"
            f"<h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>")


def write_report(source: str | Path, out: str | Path, model: str | None = None) -> Path:
    """Render and write the report atomically (nothing is written when rendering fails)."""
    out = Path(out)
    check_writable_dir(out)
    if out.is_dir():
        raise UserInputError(f"--out '{out}' is a folder: pass a file name such as report.html")
    return write_text_atomic(out, render_report(Path(source), model))


__all__ = ["COMPARE_FILE", "check_model", "plan_section", "render_report", "write_report"]
