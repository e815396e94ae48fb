"""`autoplan compare`: the best plan for one model and budget on each target, one table.
Thin over autoplan.compare.run_compare."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from autoplan.cli._args import positive_int, seed_in_range
from autoplan.cli._execution import execution_options, settings_from
from autoplan.cli._output import console, emit_json, err_console
from autoplan.cli._progress import RichReporter
from autoplan.cli._recover_options import method_option, recover_options, recovery_settings
from autoplan.cli._workload_options import operating_from, workload_options
from autoplan.cost.report import Objective
from autoplan.prune import PruneScore
from autoplan.quant import QuantMethod
from autoplan.runtimes import summarize_refused

if TYPE_CHECKING:
    from autoplan.compare import Comparison


def _fmt(value, spec: str, scale: float = 1.0) -> str:  # noqa: ANN001 - number or None
    return "-" if value is None else format(value * scale, spec)


def _table(c: Comparison) -> Table:
    table = Table(title=f"{c.model}, budget {c.budget}, ranked by {c.objective} (speed, $ and "
                        "energy PREDICTED by the cost model; KL MEASURED)",
                  caption="not accelerated: formats asked for (--choices, else any entry's) "
                          "that the row's runtime cannot accelerate; each with its reason in "
                          "compare.json")
    cols = ("target / runtime", "batch", "plan tok/s", "baseline tok/s", "TTFT ms", "TPOT ms",
            "$/1M tok", "J/tok", "memory GB", "KL", "x baseline", "x best uniform (or as is)",
            "not accelerated")
    for col in cols:
        table.add_column(col, justify="left" if col in (cols[0], cols[-1]) else "right",
                         overflow="fold")
    for r in c.rows:
        name = f"{r.target} / {r.runtime}"
        if r.status != "ok":
            table.add_row(name, "-", f"[red]{r.status}[/red]", r.reason, *["-"] * 9)
            continue
        p, b = r.plan or {}, r.baseline or {}
        fits = "" if p.get("fits") else " [red]NO FIT[/red]"
        table.add_row(
            name, f"{r.batch:,}", _fmt(p.get("tokens_per_s"), ",.0f"),
            _fmt(b.get("tokens_per_s"), ",.0f") if b.get("fits", True)
            else "[red]does not fit[/red]", _fmt(p.get("ttft_s"), ",.2f", 1e3),
            _fmt(p.get("tpot_s"), ",.3f", 1e3), _fmt(p.get("usd_per_1m_tokens"), ",.4f"),
            _fmt(p.get("energy_j_per_token"), ",.4f"), _fmt(p.get("memory_gb"), ",.2f") + fits,
            _fmt(r.kl, ".4f"),
            "-" if r.gain_over_baseline is None else _fmt(r.gain_over_baseline, ".3f") + "x",
            (_fmt(r.gain_over_best_uniform, ".3f") + "x") if r.gain_over_best_uniform else "-",
            summarize_refused(r.not_accelerated))
    return table


@click.command("compare")
@click.option("--model", default="smollm2-135m", show_default=True,
              help="Alias, HF folder or GGUF file.")
@click.option("--targets", required=True,
              help="Comma-separated catalog targets, e.g. h100,h200,b200,mi300x,mi355x,xeon-8480.")
@click.option("--runtime", "runtimes", multiple=True,
              help="TARGET=RUNTIME, repeatable (a target may get several); default: each "
                   "target's usual engine.")
@click.option("--budget", default="kl<=0.05", show_default=True,
              help="kl<=X, ppl<=+P% (or ppl<=+X), or suite:FILE>=-POINTS.")
@click.option("--objective", type=click.Choice([o.value for o in Objective]), default="throughput",
              show_default=True)
@workload_options(32)
@click.option("--trials", type=int, default=2000, show_default=True,
              help="Surrogate trials of each target's first round; each later round runs a "
                   "quarter as many (each plan records its total).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("compare"),
              show_default=True, help="Folder for the plans (one per target and runtime) and "
                                      "compare.json.")
@click.option("--prune-score", type=click.Choice(PruneScore.values()),
              default=PruneScore.WANDA.value, show_default=True)
@click.option("--quant-method", type=click.Choice(QuantMethod.values()),
              default=QuantMethod.RTN.value, show_default=True)
@click.option("--text", default=None, help="Calibration/evaluation text (.txt or .jsonl).")
@click.option("--choices", default=None,
              help="Comma-separated formats to search on every target (each keeps those its "
                   "runtime accelerates).")
@execution_options
@method_option(None)
@recover_options
@click.option("--trust-remote-code", is_flag=True, help="Run the model folder's own code.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def command(model, targets, runtimes, budget, objective, batch, input_len, output_len,  # noqa: ANN001, PLR0913
            ttft_ms, tpot_ms, trials, seed, out, prune_score, quant_method, text, choices,
            device, execution, offload_dir, recover_method, recover_steps, recover_lr,
            recover_rank, recover_text, recover_batch, recover_seq_len, recover_seed,
            trust_remote_code, as_json, quiet) -> None:
    """Plan one model under one budget for several targets; rank them in one table."""
    from autoplan.atomic import check_writable_dir
    from autoplan.backends.registry import resolve_target
    from autoplan.formats import parse_choices
    from autoplan.search import QualityBudget

    check_writable_dir(out)  # run_compare checks it again, and that it is not a file
    positive_int("trials", trials)
    seed_in_range(seed)

    operating = operating_from(batch, input_len, output_len, ttft_ms, tpot_ms, 32)
    parsed = QualityBudget.parse(budget)
    for name in targets.split(","):  # unknown targets: before the search stack is imported
        if name.strip():
            resolve_target(name.strip())
    picked = None if choices is None else parse_choices(
        tuple(c.strip() for c in choices.split(",") if c.strip()))
    from autoplan.compare import CompareRequest, parse_entries, run_compare
    from autoplan.compress import CompressionSettings
    from autoplan.search import SearchRequest
    from autoplan.workload import Workload

    entries = parse_entries(targets, tuple(runtimes))
    base = SearchRequest(
        model=model, budget=parsed, objective=Objective(objective),
        workload=operating.fixed() or Workload(batch=1, input_len=input_len,
                                               output_len=output_len),
        operating=None if operating.mode == "fixed" else operating, trials=trials, seed=seed,
        settings=CompressionSettings(prune_score, quant_method), text=text,
        execution=settings_from(device, execution, offload_dir),
        trust_remote_code=trust_remote_code,
        recovery=recovery_settings(recover_method, recover_steps, recover_lr, recover_rank,
                                   recover_text, recover_batch, recover_seq_len, recover_seed),
        choices=picked)
    req = CompareRequest(base, entries, out)
    with RichReporter(quiet=quiet or as_json) as reporter:
        comparison = run_compare(req, reporter)
    if as_json:
        emit_json(comparison.to_json())
        return
    console.print(_table(comparison))
    for r in comparison.rows:
        if r.status == "ok":
            console.print(f"[dim]{r.target} / {r.runtime}: {r.operating_point}; {r.outcome}; "
                          f"best uniform {r.best_uniform_name or '-'}[/dim]")
    err_console.print(f"one profile ({comparison.profile_entries:,} layer x choice scores, "
                      f"{comparison.profile_s:.1f} s), {comparison.measurements} real-model "
                      f"measurements ({comparison.reused} shared between targets, "
                      f"{comparison.cached} from earlier runs), "
                      f"{comparison.wall_s:.1f} s; plans and compare.json in {out}")


__all__ = ["command"]
