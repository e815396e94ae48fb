"""ExchangeSampler: an Optuna sampler for the per-layer choice problem that makes each trial one
move from the best feasible trial (change a random unit; repair a broken quality limit by
the best time-per-quality exchanges; now and then restart from an elite). Generic samplers
stall at their warm starts here; docs/architecture.md, "The optimizers".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autoplan.search.optimize._tables import Tables


class ExchangeSampler(optuna.samplers.BaseSampler):
    """Randomized exchange local search over fixed categorical choices (see module doc)."""

    def __init__(self, tables: Tables, limit: float, seed: int = 0, *,
                 restart_prob: float = 0.1, repair_pool: int = 16) -> None:
        self._tables, self._limit = tables, limit
        self._rng = np.random.default_rng(seed)
        self._restart_prob, self._repair_pool = restart_prob, repair_pool
        units = tables.space.units
        self._names = [u.name for u in units]
        self._labels = tables.labels
        self._time = [tables.total_time(u) for u in range(len(units))]
        self._seen = 0
        self._elites: list[tuple[float, tuple[int, ...]]] = []  # (time, picks), best first
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._space = {n: CategoricalDistribution(lbl)
                       for n, lbl in zip(self._names, self._labels, strict=True)}

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._random.reseed_rng()

    # ---- Optuna protocol -----------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return dict(self._space)  # built once: Optuna asks every trial

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self._absorb(study)
        if not self._elites:
            return {}  # nothing feasible yet: independent random sampling
        if self._rng.random() < self._restart_prob and len(self._elites) > 1:
            start = self._elites[int(self._rng.integers(len(self._elites)))][1]
        else:
            start = self._elites[0][1]
        picks = self._move(list(start))
        return {n: self._labels[u][c] for u, (n, c) in enumerate(zip(self._names, picks))}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    # ---- internals ---------------------------------------------------------------------
    def _absorb(self, study: optuna.Study) -> None:
        """Fold newly completed feasible trials into the elite list (incremental)."""
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for t in trials[self._seen:]:
            if not all(n in t.params for n in self._names):
                continue
            picks = self._tables.picks_of_params(t.params)
            if self._tables.surrogate(picks) <= self._limit:
                self._elites.append((self._tables.request_time(picks), picks))
        self._seen = len(trials)
        self._elites = sorted(set(self._elites))[:32]

    def _move(self, picks: list[int]) -> list[int]:
        n = len(picks)
        u = int(self._rng.integers(n))
        k = len(self._labels[u])
        if k > 1:
            picks[u] = int((picks[u] + self._rng.integers(1, k)) % k)
        q = self._tables.quality
        excess = sum(float(q[i][c]) for i, c in enumerate(picks)) - self._limit
        guard = 0
        while excess > 0 and guard < 4 * n:
            guard += 1
            best = None
            for v in self._rng.choice(n, size=min(self._repair_pool, n), replace=False):
                if v == u:
                    continue
                cur = picks[v]
                for c in range(len(q[v])):
                    dq = float(q[v][cur] - q[v][c])
                    if dq <= 0:
                        continue
                    dt = float(self._time[v][c] - self._time[v][cur])
                    ratio = dt / dq  # time paid per unit of quality recovered
                    if best is None or ratio < best[0]:
                        best = (ratio, int(v), c, dq)
            if best is None:
                break
            _, v, c, dq = best
            picks[v] = c
            excess -= dq
        return picks


__all__ = ["ExchangeSampler"]
