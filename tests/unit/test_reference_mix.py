"""benchmarks/_reference_mix.py on a synthetic problem: where the fastest uniform recipe
passes, the issue's reference stops there, and the stronger reference bisects on toward each
unit's fastest choice, measuring every step (its far end included)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _reference_mix import (  # noqa: E402
    FASTEST,
    fastest_picks,
    real_evaluations,
    reference_mix,
    stronger_reference,
)

# 6 units x 3 choices: 0 baseline (slow, exact), 1 the uniform recipe (faster, cheap), 2 a
# faster choice with more damage. Measured badness = the surrogate (a truthful surrogate).
TIME = [np.array([10.0, 6.0, 4.0 + 0.1 * u]) for u in range(6)]
DAMAGE = [np.array([0.0, 0.001, 0.004 * (u + 1)]) for u in range(6)]


@dataclass
class _Verifier:
    limit: float
    measured: dict = field(default_factory=dict)

    def measure(self, picks, label, bounded=False):  # noqa: ANN001, ANN201, ARG002
        picks = tuple(picks)
        if picks not in self.measured:
            bad = sum(float(DAMAGE[u][c]) for u, c in enumerate(picks))
            self.measured[picks] = SimpleNamespace(badness=bad, passed=bad <= self.limit,
                                                   label=label)
        return self.measured[picks]


def _prep(limit: float):  # noqa: ANN202
    tables = SimpleNamespace(total_time=lambda u: TIME[u], quality=DAMAGE,
                             space=SimpleNamespace(units=list(range(6))))
    return SimpleNamespace(
        tables=tables, verifier=_Verifier(limit), sign=-1, baseline_picks=(0,) * 6,
        value=lambda picks: 1.0 / sum(float(TIME[u][c]) for u, c in enumerate(picks)),
        req=SimpleNamespace(budget=SimpleNamespace(metric="kl")),
        as_is=SimpleNamespace(picks=(0,) * 6))


def test_the_stronger_reference_goes_past_the_fastest_uniform_recipe(monkeypatch):
    import autoplan.search.stages as stages

    # the only recipe: uniform choice 1 (it passes: 0.006 <= 0.03)
    monkeypatch.setattr(stages, "recipes", lambda prep: [("uniform 1", (1,) * 6)])
    monkeypatch.setattr(stages, "acceptable", lambda prep, m: m.passed)
    prep = _prep(0.03)
    ref = reference_mix(prep, SimpleNamespace(note=lambda s: None))
    assert ref.label == "uniform 1" and ref.faster is None and ref.evaluations == 1
    assert fastest_picks(prep) == (2,) * 6
    strong = stronger_reference(prep, SimpleNamespace(note=lambda s: None), ref)
    assert strong.extended and strong.faster == FASTEST
    # units ordered by time saved per damage: unit 0 first (2 us for 0.003), ...
    # the largest passing prefix: units 0-2 at choice 2 (0.003+0.007+0.011+3*0.001 = 0.024)
    assert strong.picks == (2, 2, 2, 1, 1, 1)
    assert strong.badness <= 0.03 and strong.objective > ref.objective
    assert strong.steps[0]["k"] == 6 and not strong.steps[0]["passed"]  # F itself measured
    assert strong.evaluations == real_evaluations(prep) == 1 + len(strong.steps)


def test_where_a_faster_recipe_fails_the_stronger_reference_is_the_reference(monkeypatch):
    import autoplan.search.stages as stages

    monkeypatch.setattr(stages, "recipes", lambda prep: [("uniform 2", (2,) * 6),
                                                         ("uniform 1", (1,) * 6)])
    monkeypatch.setattr(stages, "acceptable", lambda prep, m: m.passed)
    prep = _prep(0.03)
    ref = reference_mix(prep, SimpleNamespace(note=lambda s: None))
    assert ref.faster == "uniform 2"
    n = real_evaluations(prep)
    strong = stronger_reference(prep, SimpleNamespace(note=lambda s: None), ref)
    assert not strong.extended and strong.picks == ref.picks
    assert real_evaluations(prep) == n  # nothing more measured


def test_a_failing_faster_recipe_whose_bisection_finds_nothing_is_not_extended(monkeypatch):
    import autoplan.search.stages as stages

    monkeypatch.setattr(stages, "recipes", lambda prep: [("uniform 2", (2,) * 6),
                                                         ("uniform 1", (1,) * 6)])
    monkeypatch.setattr(stages, "acceptable", lambda prep, m: m.passed)
    prep = _prep(0.0065)  # uniform 1 passes (0.006); any unit at choice 2 fails
    ref = reference_mix(prep, SimpleNamespace(note=lambda s: None))
    assert ref.label == "uniform 1" and not ref.a_is_fastest
    strong = stronger_reference(prep, SimpleNamespace(note=lambda s: None), ref)
    assert not strong.extended and strong.picks == ref.picks
