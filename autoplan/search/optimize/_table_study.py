"""An in-memory study that runs the trials Optuna's own in-memory study runs with
ExchangeSampler, without its per-parameter bookkeeping (8x less CPU per trial, measured in
benchmarks/optimizer_roles.py; docs/architecture.md, "The optimizers").
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autoplan.search.optimize._sampler import ExchangeSampler

CONSTRAINT_KEY = "constraints:quality"  # where Trial.set_constraint("quality", v) puts v


class TableStudy:
    """The subset of `optuna.Study` a search uses: enqueue_trial, add_trial, optimize,
    get_trials. `evaluate(picks)` gives (values, surrogate, constraint) of a trial.

    It keeps the trials as FrozenTrials built once and runs ExchangeSampler through the
    same protocol calls, in the same order, as `Study.optimize`: WAITING (enqueued) trials
    first, in number order, with their fixed parameters; a unit with one choice takes it
    without asking the sampler; `sample_relative` once per trial, at its first unit that is
    neither fixed nor single, then `sample_independent` for each such unit it left out, in
    unit order; numbers, parameters, values and attributes (fixed_params, the constraint)
    are Optuna's, so the sampler, the journal and `_collect` see the same trials
    (tests/unit/test_table_study.py compares every trial). Only ExchangeSampler runs here: it
    reads nothing from the study but completed trials' parameters."""

    def __init__(self, sampler: ExchangeSampler, names: Sequence[str],
                 labels: Sequence[Sequence[str]]) -> None:
        self.sampler = sampler
        self._names = list(names)
        self._labels = [tuple(lb) for lb in labels]
        self._index = [{s: i for i, s in enumerate(lb)} for lb in self._labels]
        self._dists = {n: CategoricalDistribution(lb) for n, lb in zip(names, self._labels,
                                                                        strict=True)}
        self._trials: list[FrozenTrial] = []
        self._complete: list[FrozenTrial] = []  # by number: the sampler asks every trial
        self._waiting: list[FrozenTrial] = []  # by number: popped first

    # ---- the Study protocol the search and ExchangeSampler use ---------------------------
    def get_trials(self, deepcopy: bool = True,
                   states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        if states is not None and tuple(states) == (TrialState.COMPLETE,):
            out = list(self._complete)
        else:
            out = [t for t in self._trials if states is None or t.state in states]
        return copy.deepcopy(out) if deepcopy else out

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()

    def add_trial(self, trial: FrozenTrial) -> None:
        """A finished trial (mirrored from storage), numbered next, as Study.add_trial."""
        t = copy.copy(trial)
        t.number = t._trial_id = len(self._trials)
        self._trials.append(t)
        if t.state == TrialState.COMPLETE:
            self._completed(t)
        elif t.state == TrialState.WAITING:
            self._waiting.append(t)

    def enqueue_trial(self, params: Mapping[str, Any], skip_if_exists: bool = False) -> None:
        if skip_if_exists and any(t.system_attrs.get("fixed_params", t.params) == params
                                  for t in self._trials):
            return
        n = len(self._trials)
        self._trials.append(FrozenTrial(n, TrialState.WAITING, None, None, None, {}, {}, {},
                                        {"fixed_params": dict(params)}, {}, n))
        self._waiting.append(self._trials[-1])

    def optimize(self, objective: Any, n_trials: int,
                 callbacks: Sequence[Callable[[Any, FrozenTrial], None]] = ()) -> None:
        """`n_trials` trials of `objective.evaluate(picks) -> (values, surrogate,
        constraint)`; each callback is called with every finished trial."""
        for _ in range(n_trials):
            trial = self._next_trial()
            picks = self._picks(trial)
            values, surrogate, constraint = objective.evaluate(picks)
            trial.params = {n: self._labels[u][c] for u, (n, c) in
                            enumerate(zip(self._names, picks, strict=True))}
            trial.distributions = dict(self._dists)
            trial.user_attrs = {"surrogate": surrogate}
            trial.system_attrs = {**trial.system_attrs, CONSTRAINT_KEY: float(constraint)}
            bad = any(math.isnan(v) for v in values)  # Optuna fails a NaN value
            trial.state = TrialState.FAIL if bad else TrialState.COMPLETE
            trial.values = None if bad else [float(v) for v in values]
            trial.datetime_complete = datetime.now()
            if not bad:
                self._completed(trial)
            for cb in callbacks:
                cb(self, trial)

    # ---- internals ---------------------------------------------------------------------
    def _completed(self, trial: FrozenTrial) -> None:
        if self._complete and self._complete[-1].number > trial.number:
            bisect.insort(self._complete, trial, key=lambda t: t.number)
        else:
            self._complete.append(trial)

    def _next_trial(self) -> FrozenTrial:
        if self._waiting:  # Optuna pops the first WAITING trial by number
            t = self._waiting.pop(0)
            t.state, t.datetime_start = TrialState.RUNNING, datetime.now()
            return t
        n = len(self._trials)
        t = FrozenTrial(n, TrialState.RUNNING, None, datetime.now(), None, {}, {}, {}, {}, {}, n)
        self._trials.append(t)
        return t

    def _picks(self, trial: FrozenTrial) -> list[int]:
        """Each unit's choice index, asked of the sampler as Trial.suggest_categorical does."""
        fixed = trial.system_attrs.get("fixed_params", {})
        relative: dict[str, Any] | None = None
        picks = []
        for u, name in enumerate(self._names):
            labels = self._labels[u]
            if name in fixed:
                value = fixed[name]
            elif len(labels) == 1:
                value = labels[0]
            else:
                if relative is None:  # Optuna asks once, at the first sampled unit
                    space = self.sampler.infer_relative_search_space(self, trial)
                    relative = self.sampler.sample_relative(self, trial, space)
                value = relative.get(name)
                if value not in self._index[u]:
                    value = self.sampler.sample_independent(self, trial, name,
                                                            self._dists[name])
            picks.append(self._index[u][value])
        return picks


__all__ = ["CONSTRAINT_KEY", "TableStudy"]
