"""`autoplan show`'s summary: what each column's measured quality is relative to."""

from __future__ import annotations

import io

from rich.console import Console

from autoplan.cli._plan_view import render, summary_table
from autoplan.plan import schema as ps
from tests.unit.test_plan_io import sample_plan


def _text(renderable) -> str:  # noqa: ANN001 - a rich renderable
    out = io.StringIO()
    Console(file=out, width=200).print(renderable)
    return out.getvalue()


def _row(text: str, label: str) -> list[str]:
    line = next(x for x in text.splitlines() if label in x)
    return [c.strip() for c in line.split("│")[2:-1]]


def test_the_baseline_is_the_quality_reference_unless_the_source_is_quantized() -> None:
    """Quality is measured against the model as is: for an HF checkpoint that is the baseline
    (KL 0, the reference's perplexity); for a GGUF source it is the file, and the baseline
    (its dequantization) was not measured, so its column says so instead of 0."""
    plan = sample_plan()
    assert _row(_text(summary_table(plan)), "KL to original")[1] == "0"
    assert _row(_text(summary_table(plan)), "perplexity")[1] == "10.000"
    as_is = ps.Point(kind="as-is", label="as is (the source GGUF)", objective=1.0,
                     surrogate_kl=0.0, measured_kl=0.0, passed=True)
    gguf = plan.model_copy(update={"search": plan.search.model_copy(update={"points": [as_is]})})
    assert _row(_text(summary_table(gguf)), "KL to original")[1] == "-"
    assert _row(_text(summary_table(gguf)), "perplexity")[1] == "-"


def test_the_certificate_prints_small_objectives_readably() -> None:
    """A tpot objective is seconds per token: 0.011483, not "0.01"."""
    plan = sample_plan(objective="tpot")
    cert = ps.Certificate(solver="milp", optimum_objective=0.0114832, search_objective=0.0114841,
                          gap=0.00008, surrogate_limit=0.045)
    plan = plan.model_copy(update={"search": plan.search.model_copy(
        update={"certificate": cert})})
    line = next(x for x in _text(render(plan)).splitlines() if "certificate" in x)
    assert "0.011483 (tpot), search 0.011484" in line


def test_a_local_plan_names_the_machine_it_was_searched_on() -> None:
    """`local` is whichever machine runs autoplan: the title says which one the plan's
    figures are from; a catalog target's title is its name alone."""
    plan = sample_plan()
    assert "[" not in _text(summary_table(plan)).splitlines()[0]
    local = plan.model_copy(update={"target": plan.target.model_copy(update={
        "name": "local", "machine": "AMD EPYC 7B13, 2 cores, 2 threads"})})
    assert "on local [AMD EPYC 7B13, 2 cores, 2 threads]" in _text(summary_table(local))
