"""The report's plots, drawn with matplotlib (Agg) and returned as PNG bytes.

Each function takes plain data (a Plan, an Estimate, compare.json rows) and returns one
figure; nothing here reads files. Speed, $ and energy are cost-model predictions and every
axis says so; KL is measured where a point was measured, the surrogate's otherwise.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

from autoplan.cost.report import Estimate
from autoplan.errors import UserInputError
from autoplan.plan.schema import Plan

_OBJECTIVE_AXIS = {"throughput": "output tokens/s (predicted)",
                   "cost": "$ per 1M output tokens (predicted)",
                   "energy": "J per output token (predicted)",
                   "latency": "request latency s (predicted)",
                   "tpot": "TPOT s (predicted)"}
_BLOCK = re.compile(r"layers\.(\d+)\.(?:.*\.)?([^.]+)$")


def _pyplot():  # noqa: ANN202 - the pyplot module
    try:
        import matplotlib
    except ImportError:
        raise UserInputError("autoplan report draws with matplotlib: "
                             "pip install 'autoplan[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:  # noqa: ANN001 - a matplotlib Figure
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def pareto_front(plan: Plan) -> bytes:
    """Objective vs KL of the uniform recipes, measured candidates, the study's front and the
    plan; filled markers are measured KL, hollow ones the surrogate's; the budget is a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    points = plan.search.points
    styles = {"uniform": ("s", "tab:blue"), "candidate": ("o", "tab:orange"),
              "front": ("^", "tab:gray"), "baseline": ("D", "black"),
              "as-is": ("P", "tab:green"), "plan": ("*", "tab:red")}
    for kind, (marker, color) in styles.items():
        sel = [p for p in points if p.kind == kind]
        if not sel:
            continue
        for measured in (True, False):
            part = [p for p in sel if (p.measured_kl is not None) == measured]
            if not part:
                continue
            xs = [p.measured_kl if measured else p.surrogate_kl for p in part]
            ax.scatter(xs, [p.objective for p in part], marker=marker,
                       s=160 if kind == "plan" else 50,
                       facecolors=color if measured else "none", edgecolors=color,
                       label=f"{kind} ({'measured' if measured else 'surrogate'} KL)")
        if kind == "uniform":
            for p in sel:
                kl = p.measured_kl if p.measured_kl is not None else p.surrogate_kl
                bound = ">= " if p.measured_kl_lower_bound else ""  # stopped early
                ax.annotate(bound + p.label.removeprefix("uniform ").removeprefix("dense+"),
                            (kl, p.objective), fontsize=7, xytext=(4, 3),
                            textcoords="offset points")
    front = sorted((p for p in points if p.kind == "front"), key=lambda p: p.surrogate_kl)
    if front:
        ax.plot([p.surrogate_kl for p in front], [p.objective for p in front],
                color="tab:gray", lw=1)
    if plan.budget.metric == "kl":
        ax.axvline(plan.budget.limit, color="tab:red", ls="--", lw=1,
                   label=f"budget {plan.budget.text}")
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlim(left=0)
    ax.set_xlabel("KL to the original, nats/token (filled: measured; hollow: surrogate)")
    ax.set_ylabel(_OBJECTIVE_AXIS.get(plan.objective, plan.objective))
    ax.set_title(f"{plan.target.name} / {plan.runtime.name}: objective vs quality")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def block_and_role(layer: str) -> tuple[int | None, str]:
    """(block index, role) of a layer name (`model.layers.3.mlp.up_proj` -> (3, "up_proj"));
    layers outside the blocks (lm_head) have block None."""
    m = _BLOCK.search(layer)
    if not m:
        return None, layer.rsplit(".", 1)[-1]
    for marker, prefix in ((".experts.", "experts."), (".shared_expert.", "shared.")):
        if marker in layer:  # a block's routed (or shared) experts: one column per projection
            return int(m.group(1)), prefix + m.group(2)
    return int(m.group(1)), m.group(2)


def choice_map(plan: Plan) -> bytes:
    """Blocks x roles, each cell coloured by its layer's choice (layers outside the blocks,
    such as lm_head, in an extra column)."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cells: dict[tuple[int, str], str] = {}
    extra: dict[str, str] = {}
    for name, choice in plan.decisions.items():
        block, role = block_and_role(name)
        if block is None:
            extra[role] = choice
        else:
            cells[(block, role)] = choice
    roles = list(dict.fromkeys(r for _, r in sorted(cells)))
    roles += [f"{r} (outside blocks)" for r in extra]
    n_blocks = max((b for b, _ in cells), default=-1) + 1
    choices = sorted(set(plan.decisions.values()))
    index = {c: i for i, c in enumerate(choices)}
    grid = [[float("nan")] * len(roles) for _ in range(max(n_blocks, 1))]
    for (b, r), c in cells.items():
        grid[b][roles.index(r)] = index[c]
    for r, c in extra.items():
        grid[0][roles.index(f"{r} (outside blocks)")] = index[c]
    cmap = ListedColormap(plt.get_cmap("tab20").colors[: max(len(choices), 1)])
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(roles) + 3), max(3, 0.22 * n_blocks + 1.5)))
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(choices) - 0.5,
              interpolation="nearest")
    ax.set_xticks(range(len(roles)), roles, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("block")
    step = max(1, n_blocks // 16)
    ax.set_yticks(range(0, max(n_blocks, 1), step))
    ax.set_title(f"{plan.target.name} / {plan.runtime.name}: choice per layer")
    ax.legend(handles=[Patch(color=cmap(index[c]), label=c) for c in choices], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def cost_breakdown(plan: Plan, plan_est: Estimate, base_est: Estimate) -> bytes:
    """Decode-step time per block (stacked by role) for the plan, the baseline's as a line,
    and the fixed parts (attention, norms, sampling...) as a last bar."""
    plt = _pyplot()
    per: dict[str, dict[int, float]] = {}
    base_block: dict[int, float] = {}
    outside = 0.0
    for row in plan_est.layers:
        block, role = block_and_role(row.name)
        if block is None:
            outside += row.decode_s
            continue
        per.setdefault(role, {})[block] = per.get(role, {}).get(block, 0.0) + row.decode_s
    base_outside = 0.0
    for row in base_est.layers:
        block, _ = block_and_role(row.name)
        if block is None:
            base_outside += row.decode_s
        else:
            base_block[block] = base_block.get(block, 0.0) + row.decode_s
    blocks = sorted(base_block)
    labels = [str(b) for b in blocks] + ["outside blocks", "fixed"]
    fig, ax = plt.subplots(figsize=(max(6, 0.25 * len(labels) + 3), 4.2))
    bottom = [0.0] * len(labels)
    for role, by_block in per.items():
        vals = [by_block.get(b, 0.0) * 1e6 for b in blocks] + [0.0, 0.0]
        ax.bar(range(len(labels)), vals, bottom=bottom, label=role, width=0.8)
        bottom = [x + v for x, v in zip(bottom, vals, strict=True)]
    fixed = sum(t.decode_s for t in plan_est.fixed.values()) * 1e6
    tail = [outside * 1e6, fixed]
    ax.bar([len(labels) - 2, len(labels) - 1], tail, bottom=bottom[-2:], color="tab:gray",
           label="lm_head etc. / fixed", width=0.8)
    ax.plot(range(len(blocks) + 1),
            [base_block[b] * 1e6 for b in blocks] + [base_outside * 1e6], color="black",
            marker=".", lw=1, label=f"baseline {base_est.baseline}")
    step = max(1, len(labels) // 16)
    ax.set_xticks(range(0, len(labels), step), labels[::step], rotation=40, ha="right",
                  fontsize=8)
    ax.set_xlabel("block")
    ax.set_ylabel("decode step time, us (predicted)")
    ax.set_title(f"{plan.target.name}: where the decode step goes, batch "
                 f"{plan.workload.batch} (plan {plan_est.metrics.decode_s * 1e3:.3f} ms vs "
                 f"baseline {base_est.metrics.decode_s * 1e3:.3f} ms)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def compare_bars(rows: Sequence[dict[str, Any]]) -> bytes:
    """$/1M tokens and tokens/s per target, plan next to baseline (rows that fit only)."""
    plt = _pyplot()
    ok = [r for r in rows if r["status"] == "ok"]
    names = [f"{r['target']}\n{r['runtime']}" for r in ok]
    fig, axes = plt.subplots(1, 2, figsize=(11, max(3, 0.55 * len(ok) + 1.5)))
    y = list(range(len(ok)))
    for ax, key, title in ((axes[0], "usd_per_1m_tokens", "$ per 1M output tokens"),
                           (axes[1], "tokens_per_s", "output tokens/s")):
        ax.barh([v + 0.2 for v in y], [r["plan"][key] for r in ok], height=0.4, label="plan",
                color="tab:red")
        ax.barh([v - 0.2 for v in y], [r["baseline"][key] for r in ok], height=0.4,
                label="baseline", color="tab:gray")
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"{title} (predicted)")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("cost per token by target")
    axes[1].set_title("throughput by target")
    return _png(fig)


__all__ = ["block_and_role", "choice_map", "compare_bars", "cost_breakdown", "pareto_front"]
