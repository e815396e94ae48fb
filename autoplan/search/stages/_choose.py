"""Stages 3 and 4: choose what the plan holds (with the fallback policy), and certify it.

The measured budget metric alone decides whether a plan passes. The best uniform recipe
that passes when measured is the bar a searched plan must beat; if no searched plan passes,
that uniform recipe is returned, and the uncompressed baseline (which always passes) if no
uniform recipe does: the search never ends with nothing and never exceeds the budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoplan.plan import schema as ps
from autoplan.search.optimize import solve_exact
from autoplan.search.reporter import Reporter
from autoplan.search.stages._prepare import Prepared
from autoplan.search.stages._rounds import Rounds
from autoplan.search.verify import Measurement
from autoplan.textenum import TextEnum

UNIFORM_TRIES = 6  # uniform recipes measured, fastest first, until one passes


class Outcome(TextEnum):
    """What the plan holds (the plan's `search.outcome`)."""

    __noun__ = "outcome"

    PLAN = "plan"  # a searched plan, better than every passing uniform recipe
    UNIFORM = "uniform-fallback"  # the best passing uniform recipe
    BASELINE = "baseline-fallback"  # the uncompressed model


@dataclass(frozen=True)
class Chosen:
    measurement: Measurement
    outcome: Outcome
    best_uniform: Measurement | None  # labelled "uniform NAME"


def best_uniform(prep: Prepared, rep: Reporter) -> Measurement | None:
    """The fastest uniform recipe that passes when measured (among the UNIFORM_TRIES fastest).
    Only whether each passes matters until one does, so each pass stops as soon as its KL
    is certain to exceed the budget (`Verifier.measure(bounded=True)`); the one that passes
    is measured in full."""
    rep.stage("best uniform recipe")
    ordered = sorted(prep.uniform.items(), key=lambda kv: prep.sign * prep.value(kv[1]))
    for name, picks in ordered[:UNIFORM_TRIES]:
        if tuple(picks) == prep.baseline_picks:
            continue
        m = prep.verifier.measure(picks, f"uniform {name}", bounded=True)
        if m.passed:
            return dataclasses.replace(m, label=f"uniform {name}")
    return None


def choose(prep: Prepared, rounds: Rounds, rep: Reporter) -> Chosen:
    """The rounds' best passing plan, unless a passing uniform recipe beats it or it is None."""
    uniform = best_uniform(prep, rep)
    chosen, outcome = rounds.chosen, Outcome.PLAN
    if chosen is None:
        outcome = Outcome.UNIFORM if uniform else Outcome.BASELINE
        chosen = uniform or prep.verifier.measure(prep.baseline_picks, "baseline")
        rep.note("no searched plan met the budget when measured; returning the best "
                 f"{'uniform recipe' if uniform else 'baseline'} that passes")
    elif uniform and prep.sign * prep.value(uniform.picks) < prep.sign * prep.value(chosen.picks):
        chosen, outcome = uniform, Outcome.UNIFORM
    if chosen.picks == prep.baseline_picks:
        outcome = Outcome.BASELINE
        rep.note("nothing beats the baseline within the budget")
    # the plan reports its KL per slice: measured for it alone unless a budget needed them
    return Chosen(prep.verifier.with_slices(chosen), outcome, uniform)


def certify(prep: Prepared, rounds: Rounds, rep: Reporter) -> ps.Certificate:
    """The exact optimum of the additive surrogate problem, and the search's gap to it."""
    rep.stage("certificate")
    exact = solve_exact(prep.tables, rounds.limit)
    best = rounds.best_searched
    nan = float("nan")
    return ps.Certificate(
        solver="scipy.optimize.milp (HiGHS)", optimum_objective=prep.value(exact.picks),
        search_objective=prep.value(best.picks) if best else nan,
        gap=(prep.tables.request_time(best.picks) - exact.total_time) / exact.total_time
        if best else nan,
        surrogate_limit=rounds.limit)


__all__ = ["Chosen", "Outcome", "best_uniform", "choose", "certify"]
