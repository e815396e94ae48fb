"""The Optuna study: one categorical parameter per decision unit (fixed choice list), the
objective from the cost model, the quality limit as an Optuna constraint on the surrogate.

Single-objective studies use ExchangeSampler (sampler.py), a randomized exchange local search
that makes every trial one move from the best feasible trial; `multi_objective` adds the
surrogate as a second objective, samples with NSGA-II and returns the Pareto front.
Warm starts (uniform recipes, OWL allocations) are enqueued before sampling.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autoplan.cost.model import CostModel
from autoplan.cost.report import DIRECTION, Objective
from autoplan.search.sampler import ExchangeSampler
from autoplan.search.storage import load_or_create, open_storage
from autoplan.search.tables import Tables


@dataclass(frozen=True)
class StudyConfig:
    """One study. `storage` and `sampler` may be Optuna objects, as `optuna.create_study`
    takes them; a storage given as text is a URL (`open_storage`), None keeps no record, and
    a sampler of None is the default (ExchangeSampler, or NSGA-II when multi-objective)."""

    objective: Objective
    n_trials: int
    seed: int
    study_name: str
    storage: BaseStorage | str | None
    multi_objective: bool = False
    population: int = 40
    sampler: BaseSampler | None = None


@dataclass(frozen=True)
class Candidate:
    picks: tuple[int, ...]
    value: float  # objective metric
    surrogate: float
    trial: int


@dataclass(frozen=True)
class StudyResult:
    candidates: tuple[Candidate, ...]  # feasible, best first, distinct picks
    front: tuple[Candidate, ...]  # Pareto front (multi-objective only)
    n_trials: int
    resumed: int  # trials loaded from storage


def _sampler(cfg: StudyConfig, tables: Tables, limit: float) -> BaseSampler:
    if cfg.sampler is not None:
        return cfg.sampler
    if cfg.multi_objective:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.NSGAIISampler(population_size=cfg.population, seed=cfg.seed)
    return ExchangeSampler(tables, limit, seed=cfg.seed)


def run_study(tables: Tables, limit: float, cost: CostModel, cfg: StudyConfig,
              warm_starts: Sequence[Sequence[int]] = (),
              on_trial: Callable[[int, int], None] | None = None) -> StudyResult:
    """Run (or continue) the study and return feasible candidates, best first."""
    direction = DIRECTION[cfg.objective]
    directions = [direction, "minimize"] if cfg.multi_objective else [direction]
    units = tables.space.units
    persist = None
    if cfg.storage is not None:
        storage = open_storage(cfg.storage) if isinstance(cfg.storage, str) else cfg.storage
        persist = load_or_create(storage, cfg.study_name, directions)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    memory = optuna.create_study(directions=directions, sampler=_sampler(cfg, tables, limit))
    done = [t for t in persist.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))] \
        if persist else []
    if done:
        memory.add_trials(done)
    else:
        for picks in warm_starts:
            memory.enqueue_trial({u.name: tables.labels[i][c]
                                  for i, (u, c) in enumerate(zip(units, picks))},
                                 skip_if_exists=True)

    def objective(trial: optuna.Trial):  # noqa: ANN202 - optuna callback
        picks = [tables.label_index[i][trial.suggest_categorical(u.name, tables.labels[i])]
                 for i, u in enumerate(units)]
        prefill, decode = tables.times(picks)
        value = cost.metric_from_times(prefill, decode, cfg.objective)
        surrogate = tables.surrogate(picks)
        trial.set_user_attr("surrogate", surrogate)
        trial.set_constraint("quality", surrogate - limit)
        return (value, surrogate) if cfg.multi_objective else value

    total = cfg.n_trials
    remaining = max(total - len(done), 0)

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        if persist is not None and trial.state == TrialState.COMPLETE:
            persist.add_trial(trial)
        if on_trial:
            on_trial(trial.number + 1, total)  # loaded trials are numbered first

    if on_trial:
        on_trial(len(done), total)
    if remaining:
        memory.optimize(objective, n_trials=remaining, callbacks=[callback])
    trials = memory.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return _collect(trials, tables, limit, cfg, direction, len(done))


def _collect(trials: list[FrozenTrial], tables: Tables, limit: float, cfg: StudyConfig,
             direction: str, resumed: int) -> StudyResult:
    sign = -1.0 if direction == "maximize" else 1.0
    feasible: dict[tuple[int, ...], Candidate] = {}
    for t in trials:
        surrogate = float(t.user_attrs["surrogate"])
        if surrogate > limit:
            continue
        picks = tables.picks_of_params(t.params)
        if picks not in feasible:
            feasible[picks] = Candidate(picks, float(t.values[0]), surrogate, t.number)
    ranked = sorted(feasible.values(), key=lambda c: (sign * c.value, c.surrogate))
    front: list[Candidate] = []
    if cfg.multi_objective:
        # best value first among equal surrogates, or a dominated point enters the front
        for c in sorted(feasible.values(), key=lambda c: (c.surrogate, sign * c.value)):
            if not front or sign * c.value < sign * front[-1].value:
                front.append(c)
    return StudyResult(tuple(ranked), tuple(front), len(trials), resumed)


__all__ = ["Candidate", "StudyConfig", "StudyResult", "run_study"]
