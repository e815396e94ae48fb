"""The best uniform recipe: the bar a searched plan must beat, and the first measurements the
surrogate is calibrated with. Leaving the model as it is counts as a recipe (`AsIs`): a
uniform recipe slower than it is never the bar, and never measured.
"""

from __future__ import annotations

import dataclasses

from autoplan.search.reporter import Reporter
from autoplan.search.preparation import Prepared
from autoplan.search.verify import Measurement

UNIFORM_TRIES = 6  # uniform recipes measured, fastest first, until one passes


def recipes(prep: Prepared) -> list[tuple[str, tuple[int, ...]]]:
    """(label, picks) of every uniform recipe and of the model as is, fastest first (a
    recipe equal to the model as is appears once, as it)."""
    keep = prep.as_is
    out = {keep.picks: keep.label}
    for name, picks in prep.uniform.items():
        out.setdefault(tuple(picks), f"uniform {name}")
    return sorted(((label, picks) for picks, label in out.items()),
                  key=lambda lp: prep.sign * prep.value(lp[1]))


def acceptable(prep: Prepared, m: Measurement) -> bool:
    """Passes the budget, or is the model as is (what the user runs today loses nothing)."""
    return m.passed or m.picks == prep.as_is.picks


def best_uniform(prep: Prepared, rep: Reporter) -> Measurement | None:
    """The fastest uniform recipe that passes when measured, or the model as is when it is
    faster than every passing one (among the UNIFORM_TRIES fastest). Only whether each
    passes matters until one does, so each pass stops as soon as its KL is certain to
    exceed the budget (`Verifier.measure(bounded=True)`); the one that passes is measured in
    full. When all of those fail, one more: the recipe the profile predicts least lossy (a
    CPU space holds six 4-bit recipes faster than its int8 one, and a budget they all miss
    left the plan with no bar). None: those fail too."""
    rep.stage("best uniform recipe")
    ordered = recipes(prep)
    tries = ordered[:UNIFORM_TRIES]
    as_is = [picks for _, picks in ordered].index(prep.as_is.picks)
    faster = ordered[UNIFORM_TRIES:as_is]  # untried and faster than the model as is
    if faster:
        tries.append(min(faster, key=lambda lp: prep.tables.surrogate(lp[1])))
    for label, picks in tries:
        bounded = picks != prep.as_is.picks  # the model as is: its full KL, for the record
        m = prep.verifier.measure(picks, label, bounded=bounded)
        if acceptable(prep, m):
            return dataclasses.replace(m, label=label)
    return None


__all__ = ["UNIFORM_TRIES", "acceptable", "best_uniform", "recipes"]
