"""Exact optimum of the additive surrogate problem: a multiple-choice knapsack.

    minimize   sum_u T[u][c_u]          (request time; every objective is monotone in it)
    subject to sum_u Q[u][c_u] <= L     (surrogate quality budget)
               one choice per unit

solved as a 0/1 integer program with HiGHS (scipy.optimize.milp). It certifies the search:
the Optuna result's gap to this optimum is reported in the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from autoplan.errors import AutoplanError
from autoplan.search.optimize._tables import Tables


@dataclass(frozen=True)
class KnapsackSolution:
    picks: tuple[int, ...]
    total_time: float
    surrogate: float


def solve_exact(tables: Tables, limit: float, *, time_limit_s: float = 60.0) -> KnapsackSolution:
    """Optimal picks under `limit` (the all-baseline solution is always feasible: cost 0)."""
    sizes = [len(q) for q in tables.quality]
    offsets = np.cumsum([0, *sizes])
    n = int(offsets[-1])
    # Microseconds keep HiGHS' tolerances meaningful for per-layer times of 1e-6 s.
    c = np.concatenate([tables.total_time(u) for u in range(len(sizes))]) * 1e6
    q = np.concatenate(tables.quality)
    one_hot = lil_matrix((len(sizes), n))
    for u, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        one_hot[u, a:b] = 1.0
    constraints = [LinearConstraint(one_hot.tocsr(), 1, 1),
                   LinearConstraint(q.reshape(1, -1), -np.inf, limit)]
    res = milp(c, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, 1),
               options={"time_limit": time_limit_s, "mip_rel_gap": 0.0})
    if res.x is None:
        raise AutoplanError(f"exact solver failed: {res.message}")
    x = np.round(res.x).astype(int)
    picks = tuple(int(np.argmax(x[a:b])) for a, b in zip(offsets[:-1], offsets[1:]))
    return KnapsackSolution(picks, tables.request_time(picks), tables.surrogate(picks))


__all__ = ["KnapsackSolution", "solve_exact"]
