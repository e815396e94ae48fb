"""The Optuna study of a round: one categorical parameter per decision unit, the objective
from the cost model, the quality limit as a constraint on the surrogate (ExchangeSampler on
TableStudy, or NSGA-II for a Pareto front). With a storage, each process samples on a mirror
of the stored trials and stores each trial as ONE user attribute (decisions, attributes,
worker, batch): docs/architecture.md, "Many workers, one search".
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autoplan.cost.model import CostModel
from autoplan.cost.report import DIRECTION, Objective
from autoplan.errors import UserInputError
from autoplan.search.jobs import Job, JobQueue, drain, load_or_create, open_storage, worker_id
from autoplan.search.optimize._sampler import ExchangeSampler
from autoplan.search.optimize._table_study import TableStudy
from autoplan.search.optimize._tables import Tables


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


class _Objective:
    """The trial's objective: Optuna's callback (`__call__`), and `evaluate` on picks, which
    TableStudy calls with the picks it sampled the same way."""

    def __init__(self, tables: Tables, cost: CostModel, cfg: StudyConfig, limit: float) -> None:
        self.tables, self.cost, self.cfg, self.limit = tables, cost, cfg, limit

    def evaluate(self, picks: Sequence[int]) -> tuple[tuple[float, ...], float, float]:
        """(values, surrogate, quality constraint) of one pick."""
        prefill, decode = self.tables.times(picks)
        value = self.cost.metric_from_times(prefill, decode, self.cfg.objective)
        surrogate = self.tables.surrogate(picks)
        values = (value, surrogate) if self.cfg.multi_objective else (value,)
        return values, surrogate, surrogate - self.limit

    def __call__(self, trial: optuna.Trial):  # noqa: ANN204 - optuna callback
        tables = self.tables
        picks = [tables.label_index[i][trial.suggest_categorical(u.name, tables.labels[i])]
                 for i, u in enumerate(tables.space.units)]
        values, surrogate, constraint = self.evaluate(picks)
        trial.set_user_attr("surrogate", surrogate)
        trial.set_constraint("quality", constraint)
        return values if self.cfg.multi_objective else values[0]


def _memory_study(cfg: StudyConfig, tables: Tables, limit: float) -> optuna.Study | TableStudy:
    """Where trials are sampled: TableStudy for the default ExchangeSampler (the same trials
    without Optuna's per-parameter bookkeeping, _table_study.py), else an Optuna study."""
    sampler = _sampler(cfg, tables, limit)
    if type(sampler) is ExchangeSampler:
        return TableStudy(sampler, [u.name for u in tables.space.units], tables.labels)
    return optuna.create_study(directions=_directions(cfg), sampler=sampler)


def _directions(cfg: StudyConfig) -> list[str]:
    direction = DIRECTION[cfg.objective]
    return [direction, "minimize"] if cfg.multi_objective else [direction]


class _JobLost(Exception):
    """This process's batch was failed as stale by another (it is being redone there)."""


class RoundStudy:
    """One process's view of one stored study (see module doc): an in-memory study that
    samples, mirroring every stored trial, and storing each trial it finishes."""

    def __init__(self, tables: Tables, limit: float, cost: CostModel, cfg: StudyConfig,
                 storage: BaseStorage) -> None:
        self.tables, self.limit, self.cost, self.cfg = tables, limit, cost, cfg
        self.persist = load_or_create(storage, cfg.study_name, _directions(cfg))
        self.memory = _memory_study(cfg, tables, limit)
        # who stored a trial: this process, and this mirror (a process may open a study twice)
        self.worker = f"{worker_id()}/{uuid.uuid4().hex[:8]}"
        self._objective = _Objective(tables, cost, cfg, limit)
        self._mirrored: set[int] = set()
        self.stored_here = 0  # trials this mirror stored
        self.sync()

    def stored(self) -> list[FrozenTrial]:
        return self.persist.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))

    def sync(self) -> None:
        """Mirror the stored trials this process has not seen (other processes', or all of
        them on a re-run) into the in-memory study, in storage order."""
        for t in self.stored():
            if t._trial_id not in self._mirrored:
                self._mirrored.add(t._trial_id)
                if stored_by(t)[0] != self.worker:
                    self.memory.add_trial(_unpacked(t, self.tables, self.cfg.study_name))

    def enqueue(self, warm_starts: Sequence[Sequence[int]]) -> None:
        _enqueue(self.memory, self.tables, warm_starts)

    def run(self, n: int, batch: str, still_mine: Callable[[], bool] = lambda: True,
            on_trial: Callable[[int, int], None] | None = None, total: int = 0) -> bool:
        """Sample `n` trials, storing each as it finishes; False if the batch was taken
        over (failed as stale) before the last one was stored."""
        def callback(study: optuna.Study, trial: FrozenTrial) -> None:
            if trial.state != TrialState.COMPLETE:
                return
            if not still_mine():
                raise _JobLost
            self.persist.add_trial(_packed(trial, self.tables, self.worker, batch))
            self.stored_here += 1
            if on_trial:
                on_trial(min(trial.number + 1, total), total)  # mirrored trials come first

        try:
            if n > 0:
                self.memory.optimize(self._objective, n_trials=n, callbacks=[callback])
        except _JobLost:
            return False
        return True

    def complete(self) -> list[FrozenTrial]:
        return self.memory.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _enqueue(memory: optuna.Study | TableStudy, tables: Tables,
             warm_starts: Sequence[Sequence[int]]) -> None:
    """Warm starts as enqueued trials (they bypass the sampler; a repeated one is skipped)."""
    units, labels = tables.space.units, tables.labels
    for picks in warm_starts:
        memory.enqueue_trial({u.name: labels[i][c]
                              for i, (u, c) in enumerate(zip(units, picks, strict=True))},
                             skip_if_exists=True)


def _packed(trial: FrozenTrial, tables: Tables, worker: str, batch: str) -> FrozenTrial:
    """The trial as stored: its value and ONE user attribute, `trial`, holding its decisions,
    its attributes (surrogate, constraint), who ran it and in which batch."""
    return optuna.trial.create_trial(values=trial.values, user_attrs={"trial": {
        "decisions": {u.name: trial.params[u.name] for u in tables.space.units},
        "user": dict(trial.user_attrs), "system": dict(trial.system_attrs),
        "worker": worker, "batch": batch}})


def stored_by(trial: FrozenTrial) -> tuple[str | None, str | None]:
    """(worker, batch) of a stored trial (None, None for one stored by an older autoplan)."""
    packed = trial.user_attrs.get("trial") or {}
    return packed.get("worker"), packed.get("batch")


def _unpacked(stored: FrozenTrial, tables: Tables, study: str) -> FrozenTrial:
    """A stored trial with its decisions as the parameters the sampler reads (a trial
    stored with parameters, by an older autoplan, is used as it is)."""
    if stored.params:
        return stored
    packed = stored.user_attrs.get("trial") or {}
    decisions = packed.get("decisions", {})
    units = tables.space.units
    if set(decisions) != {u.name for u in units} or any(
            decisions[u.name] not in tables.label_index[i] for i, u in enumerate(units)):
        raise UserInputError(f"study {study} in this storage holds trials of another search "
                             "space: pass another --study (or storage)")
    return optuna.trial.create_trial(
        params={u.name: decisions[u.name] for u in units},
        distributions={u.name: CategoricalDistribution(tables.labels[i])
                       for i, u in enumerate(units)},
        values=stored.values, user_attrs=packed.get("user", {}),
        system_attrs=packed.get("system", {}))


def _every(seconds: float, check: Callable[[], bool]) -> Callable[[], bool]:
    """`check`, asked at most once per `seconds` (True in between): whether a batch is
    still this process's costs a database read, more than storing a trial."""
    last = [time.monotonic()]

    def ask() -> bool:
        if time.monotonic() - last[0] < seconds:
            return True
        last[0] = time.monotonic()
        return check()

    return ask


def run_batch(queue: JobQueue, job: Job, study: RoundStudy,
              on_trial: Callable[[int, int], None] | None = None, total: int = 0) -> None:
    """Run one claimed batch of trials: its size less what a killed holder already stored
    (a re-queued batch), the round's warm starts first in its first batch."""
    batch = job.attrs["batch"]
    study.sync()
    n = int(job.attrs["size"])
    if job.retry:
        n -= sum(1 for t in study.stored() if stored_by(t)[1] == batch)
    if job.attrs.get("index") == 0:
        study.enqueue(queue.attr(f"warm:{study.cfg.study_name}", []))
    if study.run(n, batch, _every(1.0, lambda: queue.still_mine(job)), on_trial, total):
        queue.complete(job)


def run_study(tables: Tables, limit: float, cost: CostModel, cfg: StudyConfig,
              warm_starts: Sequence[Sequence[int]] = (),
              on_trial: Callable[[int, int], None] | None = None,
              queue: JobQueue | None = None,
              batch_attrs: dict | None = None) -> StudyResult:
    """Run (or continue) the study and return feasible candidates, best first.

    With a storage, the study's trials are planned as batches in the search's job `queue`
    (default: the study's own) and this process runs batches until every one is done,
    whoever ran them: the study then holds exactly `cfg.n_trials` trials (or what an
    earlier, larger run stored). `batch_attrs` go into every batch (what a worker needs to
    rebuild `tables`: the round's calibration)."""
    direction = DIRECTION[cfg.objective]
    total = cfg.n_trials
    if cfg.storage is None:
        memory = _memory_study(cfg, tables, limit)
        study = None
    else:
        storage = open_storage(cfg.storage) if isinstance(cfg.storage, str) else cfg.storage
        queue = queue or JobQueue(storage, cfg.study_name)
        study = RoundStudy(tables, limit, cost, cfg, storage)
        memory = study.memory
    resumed = len(memory.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if on_trial:
        on_trial(resumed, total)
    if study is None:
        _enqueue(memory, tables, warm_starts)
        if total:
            memory.optimize(_Objective(tables, cost, cfg, limit), n_trials=total, callbacks=[
                lambda s, t: on_trial(t.number + 1, total)] if on_trial else [])
    else:
        name = cfg.study_name
        if queue.attr(f"plan:{name}") is None and resumed == 0:
            queue.set_attr(f"warm:{name}", [[int(c) for c in p] for p in warm_starts])
        queue.plan_batches(name, total, resumed, {"limit": limit, **(batch_attrs or {})})
        drain(queue, lambda: queue.batches_done(name),
              lambda j: j.kind == "trials" and j.attrs.get("study") == name,
              lambda j: run_batch(queue, j, study, on_trial, total))
        study.sync()
    trials = memory.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return _collect(trials, tables, limit, cfg, direction, resumed)


def _collect(trials: list[FrozenTrial], tables: Tables, limit: float, cfg: StudyConfig,
             direction: str, resumed: int) -> StudyResult:
    sign = -1.0 if direction == "maximize" else 1.0
    feasible: dict[tuple[int, ...], Candidate] = {}
    for t in trials:
        picks = tables.picks_of_params(t.params)
        surrogate = tables.surrogate(picks)  # these tables' (a trial stores its own run's)
        if surrogate > limit:
            continue
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


__all__ = ["Candidate", "RoundStudy", "StudyConfig", "StudyResult", "run_batch", "run_study",
           "stored_by"]
