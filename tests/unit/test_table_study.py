"""TableStudy runs exactly the trials Optuna's own study runs with ExchangeSampler: every
trial's number, state, parameters, values and attributes, through run_study with and
without a journal (the stored trials too)."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from optuna.trial import TrialState

from autoplan.cost.report import Objective
from autoplan.search import DecisionUnit
from autoplan.search.jobs import open_storage
from autoplan.search.optimize import (
    ExchangeSampler,
    StudyConfig,
    TableStudy,
    lagrangian_allocations,
    run_study,
)
from autoplan.search.optimize._study import _memory_study, _Objective
from tests.unit._tiny import llama_tables, random_tables


class _OptunaPath(ExchangeSampler):
    """The same sampler, which `_memory_study` leaves to Optuna's study (not its class)."""


def _with_single_choice_unit(tables):  # noqa: ANN001, ANN202
    """`tables` with unit 1 reduced to its baseline (a unit Optuna never asks about)."""
    units = list(tables.space.units)
    units[1] = DecisionUnit(units[1].name, units[1].layers, units[1].choices[:1])
    space = dataclasses.replace(tables.space, units=tuple(units))
    cut = lambda arrs: tuple(a[:1] if i == 1 else a for i, a in enumerate(arrs))  # noqa: E731
    return dataclasses.replace(tables, space=space, prefill=cut(tables.prefill),
                               decode=cut(tables.decode), quality=cut(tables.quality))


def _record(trials) -> list[tuple]:  # noqa: ANN001
    return [(t.number, t.state, t.params, t.values, t.user_attrs, t.system_attrs)
            for t in trials]


@pytest.mark.parametrize("make", [lambda: llama_tables(n_layers=6)[:2],
                                  lambda: (_with_single_choice_unit(random_tables(12, 4, 1)),
                                           llama_tables(n_layers=2)[1])])
def test_same_trials_as_optunas_study(make) -> None:  # noqa: ANN001
    tables, cost = make()
    limit = 0.2 * sum(float(q.max()) for q in tables.quality)
    cfg = StudyConfig(Objective.THROUGHPUT, 0, 7, "s", None)
    warm = lagrangian_allocations(tables, limit, count=3) + [[0] * len(tables.space.units)]
    runs = []
    for sampler in (None, _OptunaPath(tables, limit, seed=7)):
        study = _memory_study(dataclasses.replace(cfg, sampler=sampler), tables, limit)
        assert isinstance(study, TableStudy) == (sampler is None)
        seen = []
        for round_trials in (5, 120):  # warm starts (one twice), then sampled trials
            for picks in warm + warm[:1]:
                study.enqueue_trial({u.name: tables.labels[i][c] for i, (u, c) in
                                     enumerate(zip(tables.space.units, picks, strict=True))},
                                    skip_if_exists=True)
            study.optimize(_Objective(tables, cost, cfg, limit), n_trials=round_trials,
                           callbacks=[lambda s, t, seen=seen: seen.append(t.number)])
        runs.append((_record(study.get_trials(deepcopy=False)), seen))
    assert runs[0] == runs[1]
    states = {t[1] for t in runs[0][0]}
    assert states == {TrialState.COMPLETE}
    assert len({tuple(t[2].values()) for t in runs[0][0]}) > 30  # the sampler moved


def test_run_study_stores_the_same_journal(tmp_path) -> None:  # noqa: ANN001
    tables, cost, _ = llama_tables(n_layers=4)
    limit = 0.15 * sum(float(q.max()) for q in tables.quality)
    warm = [[0] * len(tables.space.units)]
    out = []
    for name, sampler in (("fast", None), ("optuna", _OptunaPath(tables, limit, seed=2))):
        url = f"journal:{tmp_path / name}.journal"
        cfg = StudyConfig(Objective.THROUGHPUT, 90, 2, "s", url, sampler=sampler)
        res = run_study(tables, limit, cost, cfg, warm)
        stored = optuna.load_study(study_name="s", storage=open_storage(url)).get_trials(
            states=(TrialState.COMPLETE,))
        packed = [t.user_attrs["trial"] for t in stored]
        out.append((res.candidates, res.n_trials, [
            (p["decisions"], p["user"], p["system"]) for p in packed],
                    [t.values for t in stored]))
    assert out[0] == out[1]
    assert len(out[0][2]) == 90
