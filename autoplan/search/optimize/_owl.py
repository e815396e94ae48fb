"""OWL-style allocation (Yin et al. 2024, "Outlier Weighed Layerwise sparsity"): blocks with
more activation outliers get gentler compression, blocks with fewer get harsher.

OWL sets per-block sparsity = target +/- lambda around the mean, inversely to the block's
outlier ratio. Generalized to choices: each unit's choices are ranked by how much time they
save; a block's "aggressiveness" in [0, 1] (inverse outlier rank) picks the matching rung.
Several lambdas give several warm starts; the constraint decides which are feasible.
"""

from __future__ import annotations

import numpy as np

from autoplan.search.optimize._tables import Tables
from autoplan.sensitivity import SensitivityProfile


def owl_allocations(tables: Tables, profile: SensitivityProfile,
                    levels: tuple[float, ...] = (0.25, 0.5, 0.75)) -> list[list[int]]:
    """Warm-start picks: for each mean aggressiveness level, an outlier-weighted allocation."""
    units = tables.space.units
    block_ratio: dict[int, list[float]] = {}
    for unit in units:
        for layer in unit.layers:
            block_ratio.setdefault(layer.block, []).append(profile.outliers.get(layer.name, 0.0))
    blocks = sorted(block_ratio)
    ratio = np.array([np.mean(block_ratio[b]) for b in blocks])
    # rank 0 = fewest outliers = most compressible; spread over [-1, 1]
    order = ratio.argsort().argsort()
    spread = 1 - 2 * order / max(len(blocks) - 1, 1)
    rank_of = dict(zip(blocks, spread))
    out = []
    for level in levels:
        picks = []
        for u, unit in enumerate(units):
            lam = min(level, 1 - level)  # OWL's lambda: stay inside [0, 1]
            aggr = float(np.clip(level + lam * rank_of[unit.layers[0].block], 0, 1))
            # choices from slowest to fastest; Pareto-dominated rungs (slower AND worse) skipped
            t, q = tables.total_time(u), tables.quality[u]
            ladder = [i for i in np.argsort(-t) if not any(
                t[j] <= t[i] and q[j] <= q[i] and (t[j], q[j]) != (t[i], q[i]) for j in range(len(t)))]
            picks.append(int(ladder[round(aggr * (len(ladder) - 1))]))
        out.append(picks)
    return out





def lagrangian_allocations(tables: Tables, limit: float, count: int = 12) -> list[list[int]]:
    """Warm-start picks on the convex hull of the additive problem (the classic greedy for
    the multiple-choice knapsack).

    For a multiplier lam every unit independently takes argmin(time + lam * quality). The
    picks change only at breakpoints lam = -dt/dq between two choices of one unit, so
    sweeping just above and below every breakpoint walks the hull one switch at a time.
    Hull points just inside the limit are near-optimal, not optimal (the integer optimum can
    sit off the hull): the study improves on them and the exact certificate measures it.
    """
    n_units = len(tables.quality)
    times = [tables.total_time(u) for u in range(n_units)]
    lams = []
    for u in range(n_units):
        t, q = times[u], tables.quality[u]
        dq = q[None, :] - q[:, None]
        dt = t[:, None] - t[None, :]
        ok = (dq > 0) & (dt > 0)
        lams.extend((dt[ok] / dq[ok]).tolist())
    if not lams:
        return []
    # all units at once: [units, choices] with unused slots at +inf time, never picked
    # (each unit's row is computed exactly as on its own, so argmin picks the same index)
    width = max(len(t) for t in times)
    t_all = np.full((n_units, width), np.inf)
    q_all = np.zeros((n_units, width))
    for u in range(n_units):
        t_all[u, :len(times[u])] = times[u]
        q_all[u, :len(times[u])] = tables.quality[u]
    hull: dict[tuple[int, ...], None] = {}
    for lam in sorted(set(lams)):
        for eps in (1 - 1e-9, 1 + 1e-9):
            hull[tuple(np.argmin(t_all + lam * eps * q_all, axis=1).tolist())] = None
    feasible = [list(p) for p in hull if tables.surrogate(p) <= limit]
    feasible.sort(key=tables.request_time)
    return feasible[:count]


__all__ = ["lagrangian_allocations", "owl_allocations"]
