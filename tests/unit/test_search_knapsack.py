"""The exact multiple-choice knapsack, the warm starts (Lagrangian hull, OWL) and the
exchange sampler's distance to the exact optimum."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from autoplan.compress import CompressionSettings
from autoplan.modelspec import LinearLayer
from autoplan.search import DecisionUnit, SearchSpace
from autoplan.search.optimize import (
    ExchangeSampler,
    Tables,
    lagrangian_allocations,
    owl_allocations,
    solve_exact,
)
from autoplan.sensitivity import SensitivityProfile
from tests.unit._tiny import _CHOICES, brute_force, random_tables, total_time


def _full(tables: Tables) -> float:
    return sum(float(q.max()) for q in tables.quality)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("frac", [0.02, 0.1, 0.3, 0.6, 1.0])
def test_exact_matches_brute_force(seed: int, frac: float) -> None:
    tables = random_tables(6, 4, seed)
    limit = frac * _full(tables)
    best_time, best_picks = brute_force(tables, limit)
    sol = solve_exact(tables, limit)
    assert sol.surrogate <= limit * (1 + 1e-9)
    assert sol.surrogate == pytest.approx(tables.surrogate(sol.picks))
    assert sol.total_time == pytest.approx(total_time(tables, sol.picks), rel=1e-12)
    assert sol.total_time == pytest.approx(best_time, rel=1e-9), (sol.picks, best_picks)


def test_unconstrained_limit_takes_each_units_fastest_choice() -> None:
    tables = random_tables(6, 4, 3)
    sol = solve_exact(tables, 10 * _full(tables))
    assert list(sol.picks) == [int(np.argmin(tables.total_time(u))) for u in range(6)]


@pytest.mark.parametrize("limit", [0.0, 1e-12])
def test_limit_below_every_choice_returns_all_baseline(limit: float) -> None:
    tables = random_tables(8, 5, 4)
    assert min(float(q[1:].min()) for q in tables.quality) > limit
    sol = solve_exact(tables, limit)
    assert sol.picks == (0,) * 8
    assert sol.surrogate == 0.0


# ---- Lagrangian hull warm starts ------------------------------------------------------------
@pytest.mark.parametrize("frac", [0.05, 0.2, 0.5])
def test_lagrangian_allocations_feasible_sorted_and_near_optimal(frac: float) -> None:
    tables = random_tables(30, 5, 7)
    limit = frac * _full(tables)
    allocs = lagrangian_allocations(tables, limit, count=12)
    assert 0 < len(allocs) <= 12
    times = [total_time(tables, p) for p in allocs]
    assert all(tables.surrogate(p) <= limit for p in allocs)
    assert times == sorted(times)
    assert len({tuple(p) for p in allocs}) == len(allocs)
    # each is a hull point: a unit's pick is never both slower and costlier than another
    for p in allocs:
        for u, c in enumerate(p):
            t, q = tables.total_time(u), tables.quality[u]
            assert not np.any((t < t[c]) & (q < q[c]))
    exact = solve_exact(tables, limit)
    assert times[0] >= exact.total_time * (1 - 1e-12)
    assert times[0] <= exact.total_time * 1.05  # the hull greedy is close on 30 units


def test_lagrangian_zero_limit_gives_all_baseline() -> None:
    tables = random_tables(10, 4, 8)
    assert lagrangian_allocations(tables, 0.0) == [[0] * 10]


# ---- OWL warm starts ----------------------------------------------------------------------
def _ladder_tables(n_blocks: int) -> tuple[Tables, SensitivityProfile]:
    """One unit per block, identical tables, outlier ratio increasing with the block index."""
    choices = _CHOICES[:5]
    t = np.array([1.0, 0.7, 0.6, 0.4, 0.3]) * 1e-3
    q = np.array([0.0, 0.001, 0.004, 0.01, 0.02])
    units = tuple(DecisionUnit(f"u{b}", (LinearLayer(f"l{b}", "o", b, 64, 64, f"g{b}"),), choices)
                  for b in range(n_blocks))
    space = SearchSpace("t", "r", choices[0], units, ())
    tables = Tables(space, (t,) * n_blocks, (t / 10,) * n_blocks, (q,) * n_blocks, 0.0, 0.0, 4)
    prof = SensitivityProfile("m", "c", CompressionSettings(),
                              outliers={f"l{b}": 0.01 * (b + 1) for b in range(n_blocks)})
    return tables, prof


def test_owl_gives_outlier_heavy_blocks_gentler_choices() -> None:
    tables, prof = _ladder_tables(6)
    allocs = owl_allocations(tables, prof, levels=(0.25, 0.5, 0.75))
    assert len(allocs) == 3
    for picks in allocs:
        times = [float(tables.total_time(u)[c]) for u, c in enumerate(picks)]
        assert times == sorted(times)  # more outliers (higher block) -> slower, gentler
        assert times[0] < times[-1]
    totals = [total_time(tables, p) for p in allocs]
    assert totals[0] > totals[1] > totals[2]  # a higher level compresses harder


def test_owl_skips_dominated_rungs() -> None:
    tables, prof = _ladder_tables(4)
    q = tables.quality[0].copy()
    q[2] = 0.05  # choice 2 is now slower AND worse than choice 3: never a rung
    tables = Tables(tables.space, tables.prefill, tables.decode, (q,) * 4, 0.0, 0.0, 4)
    for picks in owl_allocations(tables, prof, levels=(0.1, 0.3, 0.5, 0.7, 0.9)):
        assert 2 not in picks


def test_owl_claims_no_feasibility_but_lagrangian_does() -> None:
    tables = random_tables(12, 5, 9)
    limit = 0.05 * _full(tables)
    prof = SensitivityProfile("m", "c", CompressionSettings(),
                              outliers={f"l{u}": 0.001 * u for u in range(12)})
    owl = owl_allocations(tables, prof)
    assert any(tables.surrogate(p) > limit for p in owl)
    assert all(tables.surrogate(p) <= limit for p in lagrangian_allocations(tables, limit))


# ---- the exchange sampler vs the exact optimum ----------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_exchange_sampler_within_one_percent_of_exact(seed: int) -> None:
    tables = random_tables(30, 5, seed)
    limit = 0.2 * _full(tables)
    names = [u.name for u in tables.space.units]
    labels = [[str(c) for c in u.choices] for u in tables.space.units]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=ExchangeSampler(tables, limit, seed=0))
    study.enqueue_trial({n: lbl[0] for n, lbl in zip(names, labels)})  # all-baseline start
    feasible: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        picks = [labels[u].index(trial.suggest_categorical(n, labels[u]))
                 for u, n in enumerate(names)]
        t = total_time(tables, picks)
        if tables.surrogate(picks) <= limit:
            feasible.append(t)
        return t

    study.optimize(objective, n_trials=600)
    exact = solve_exact(tables, limit)
    gap = (min(feasible) - exact.total_time) / exact.total_time
    assert -1e-9 <= gap <= 0.01, gap
    # after the first feasible point every move is repaired: almost all trials are feasible
    assert len(feasible) >= 0.9 * 600


def test_the_tpot_objective_ignores_prefill():
    """A choice that decodes faster but prefills slower wins only when prefill has no weight
    (`--objective tpot`, e.g. Q4_1 vs Q8_0 in llama.cpp, where Q8_0 prefills through a
    fast GEMM)."""
    import dataclasses

    import numpy as np

    from autoplan.cost.report import DIRECTION, Objective
    from autoplan.search.optimize import solve_exact
    from tests.unit._tiny import random_tables

    base = random_tables(1, 2, seed=0, output_len=8)
    # choice 1: 10x the prefill of choice 0, half its decode, no quality cost
    tables = dataclasses.replace(base, prefill=(np.array([1e-3, 1e-2]),),
                                 decode=(np.array([1e-4, 5e-5]),),
                                 quality=(np.array([0.0, 0.0]),))
    assert solve_exact(tables, 1.0).picks == (0,)
    assert solve_exact(dataclasses.replace(tables, prefill_weight=0.0), 1.0).picks == (1,)
    assert DIRECTION[Objective.TPOT] == "minimize"
