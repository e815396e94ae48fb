"""Stages 3 and 4: choose what the plan holds, and certify it.

The plan is the fastest acceptable measurement (a mix, a uniform recipe or the model as is,
always acceptable), unless the noise rule makes it a measured candidate of better quality;
`Chosen.why` says which. Reasoning: docs/modules.md, docs/search-quality.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.plan import schema as ps
from autoplan.search.optimize import solve_exact
from autoplan.search.reporter import Reporter
from autoplan.search.preparation import Prepared
from autoplan.search.stages._rounds import Rounds, speed_gain
from autoplan.search.stages._uniform import acceptable, best_uniform
from autoplan.search.verify import Measurement
from autoplan.textenum import TextEnum


class Outcome(TextEnum):
    """What the plan holds (the plan's `search.outcome`)."""

    __noun__ = "outcome"

    PLAN = "plan"  # a searched mix, faster than every acceptable uniform recipe
    UNIFORM = "uniform-fallback"  # a uniform recipe
    BASELINE = "baseline-fallback"  # the uncompressed model
    AS_IS = "as-is"  # the quantized source, unchanged


@dataclass(frozen=True)
class Chosen:
    measurement: Measurement
    outcome: Outcome
    best_uniform: Measurement | None  # labelled "uniform NAME", or the model as is
    why: str = ""  # why the plan holds this measurement (the plan's `search.why`)


def _quality_rank(prep: Prepared, m: Measurement) -> float:
    """Lower is better quality: the measured badness, and 0 for the model as is (nothing
    lost against what the user runs today)."""
    return 0.0 if m.picks == prep.as_is.picks else m.badness


def _noise_rule(prep: Prepared, fastest: Measurement, options: list[Measurement]
                ) -> tuple[Measurement, str]:
    """`fastest`, or the best-quality option whose speed it beats by no more than the
    speed prediction's uncertainty (and why)."""
    u = prep.uncertainty
    rank = _quality_rank(prep, fastest)
    within = [m for m in options if _quality_rank(prep, m) < rank
              and speed_gain(prep, fastest.picks, m.picks) <= 1.0 + u.relative]
    if not within:
        return fastest, f"{fastest.label}: the fastest measured candidate that is acceptable"
    pick = min(within, key=lambda m: (_quality_rank(prep, m), prep.sign * prep.value(m.picks)))
    gain = speed_gain(prep, fastest.picks, pick.picks)
    metric = prep.req.budget.metric
    return pick, (f"{pick.label}: the fastest acceptable candidate, {fastest.label} (measured "
                  f"{metric} {fastest.badness:.4g}), is predicted only {gain:.4f}x as fast, "
                  f"within the speed prediction's uncertainty of +-{u.relative:.1%} "
                  f"({u.source}); {pick.label} measures {metric} {pick.badness:.4g}")


def _outcome(prep: Prepared, m: Measurement) -> Outcome:
    if m.picks == prep.as_is.picks and prep.as_is.quantized_source:
        return Outcome.AS_IS
    if m.picks == prep.baseline_picks:
        return Outcome.BASELINE
    if any(tuple(p) == m.picks for p in prep.uniform.values()):
        return Outcome.UNIFORM
    return Outcome.PLAN


def choose(prep: Prepared, rounds: Rounds, rep: Reporter) -> Chosen:
    """The fastest acceptable measurement, under the noise rule (module doc)."""
    uniform = best_uniform(prep, rep)  # measured by the rounds already: no new pass
    # the model as is is always a candidate (the uncompressed one: known without a pass)
    prep.verifier.measure(prep.as_is.picks, prep.as_is.label)
    options = [m for m in prep.verifier.measured.values()
               if acceptable(prep, m) and not m.quality.stopped_early]
    fastest = min(options, key=lambda m: prep.sign * prep.value(m.picks))
    chosen, why = _noise_rule(prep, fastest, options)
    outcome = _outcome(prep, chosen)
    if chosen.picks == prep.baseline_picks:
        rep.note("nothing beats the baseline within the budget")
    # the plan reports its KL per slice: measured for it alone unless a budget needed them
    return Chosen(prep.verifier.with_slices(chosen), outcome, uniform, why)


def certify(prep: Prepared, rounds: Rounds, rep: Reporter) -> ps.Certificate | None:
    """The exact optimum of the additive surrogate problem, and the search's gap to it; None
    when the problem has no solution: a KV cache whose own predicted KL exceeds the last
    limit leaves none, since every candidate carries it (`with_kv_surrogate`)."""
    rep.stage("certificate")
    tables = rounds.calibration.tables(prep.tables) if rounds.calibration else prep.tables
    floor = tables.surrogate(prep.baseline_picks)  # what the all-baseline candidate costs
    if floor > rounds.limit:
        rep.note(f"no certificate: every candidate's predicted KL is at least {floor:.4g} "
                 f"(the KV cache's), over the surrogate limit {rounds.limit:.4g}")
        return None
    exact = solve_exact(tables, rounds.limit)
    best = rounds.best_searched
    nan = float("nan")

    def whole(picks) -> float:  # noqa: ANN001 - any picks
        # the whole time, constant terms included: the gap relative to the variable part
        # alone read 3.5 % where the objectives printed beside it were 0.9 % apart
        return prep.tables.request_time(picks) + prep.tables.constant_time

    return ps.Certificate(
        solver="scipy.optimize.milp (HiGHS)", optimum_objective=prep.value(exact.picks),
        search_objective=prep.value(best.picks) if best else nan,
        gap=(whole(best.picks) - whole(exact.picks)) / whole(exact.picks) if best else nan,
        surrogate_limit=rounds.limit)


__all__ = ["Chosen", "Outcome", "certify", "choose"]
