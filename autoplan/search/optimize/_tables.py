"""Per decision unit x choice tables of predicted time and surrogate quality cost.

Everything the search evaluates per trial is a sum over units of entries of these tables,
so a trial costs microseconds and the exact optimum of the additive problem is computable
(_knapsack.py). Times come from the cost model for the workload; quality costs from the
sensitivity profile (KL nats per token). The baseline choice costs 0 by definition: it is
the reference the plan's quality is measured against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autoplan.cost.model import CostModel
from autoplan.formats import Choice
from autoplan.search.optimize._space import SearchSpace
from autoplan.sensitivity import SensitivityProfile


@dataclass(frozen=True)
class Tables:
    """prefill/decode seconds and quality cost, each [unit][choice index]."""

    space: SearchSpace
    prefill: tuple[np.ndarray, ...]
    decode: tuple[np.ndarray, ...]
    quality: tuple[np.ndarray, ...]
    const_prefill: float  # fixed terms + protected layers
    const_decode: float
    output_len: int
    # Weight of prefill against (out - 1) decode steps in the time the search minimizes:
    # 1 (request time) for every objective but TPOT, which ignores prefill (0).
    prefill_weight: float = 1.0

    def total_time(self, u: int) -> np.ndarray:
        """Time contribution of unit u per choice that every objective is monotone in:
        prefill_weight * prefill + (out - 1) * decode."""
        return self._total_times[u]

    @cached_property
    def _total_times(self) -> tuple[np.ndarray, ...]:  # the sampler asks every trial
        return tuple(self.prefill_weight * p + (self.output_len - 1) * d
                     for p, d in zip(self.prefill, self.decode, strict=True))

    def request_time(self, picks: Sequence[int]) -> float:
        """Sum of the units' request-time contributions (every objective is monotone in it)."""
        totals = self._total_times
        return sum(float(totals[u][c]) for u, c in enumerate(picks))

    @property
    def constant_time(self) -> float:
        """The part of the time `total_time` weighs that no decision changes (fixed terms,
        protected layers): with `request_time` it gives the whole, whose ratios are the
        objective's."""
        return self.prefill_weight * self.const_prefill + (self.output_len - 1) * self.const_decode

    @cached_property
    def labels(self) -> tuple[tuple[str, ...], ...]:
        """Per unit, its choices as the strings Optuna stores as parameter values."""
        return tuple(tuple(str(c) for c in unit.choices) for unit in self.space.units)

    @cached_property
    def label_index(self) -> tuple[dict[str, int], ...]:
        """Per unit, choice string -> index into its choice list."""
        return tuple({s: i for i, s in enumerate(lbl)} for lbl in self.labels)

    def picks_of_params(self, params: Mapping[str, str]) -> tuple[int, ...]:
        """Choice indices from an Optuna trial's params (unit name -> choice string)."""
        return tuple(self.label_index[u][params[unit.name]]
                     for u, unit in enumerate(self.space.units))

    def times(self, picks: Sequence[int]) -> tuple[float, float]:
        p = self.const_prefill + sum(float(self.prefill[u][c]) for u, c in enumerate(picks))
        d = self.const_decode + sum(float(self.decode[u][c]) for u, c in enumerate(picks))
        return p, d

    def surrogate(self, picks: Sequence[int]) -> float:
        return sum(float(self.quality[u][c]) for u, c in enumerate(picks))

    def picks_of(self, by_unit: Mapping[str, Choice]) -> list[int]:
        return [unit.choices.index(by_unit.get(unit.name, self.space.baseline))
                for unit in self.space.units]

    def choices_of(self, picks: Sequence[int]) -> dict[str, Choice]:
        return {unit.name: unit.choices[c] for unit, c in zip(self.space.units, picks)}

    def uniform_picks(self, choice: Choice) -> list[int] | None:
        """Picks applying `choice` everywhere, or None if some unit cannot take it."""
        if not all(choice in unit.choices for unit in self.space.units):
            return None
        return [unit.choices.index(choice) for unit in self.space.units]


def build_tables(space: SearchSpace, cost: CostModel, profile: SensitivityProfile, *,
                 prefill_weight: float = 1.0) -> Tables:
    """Fill the tables from the cost model and the profile (missing profile entries raise).

    ``prefill_weight``: 0 when the objective is TPOT (only decode steps count), else 1."""
    fixed = cost.fixed_time()
    cp, cd = fixed.prefill_s, fixed.decode_s
    for layer in space.protected:
        t = cost.layer_time(layer, space.baseline)
        cp, cd = cp + t.prefill_s, cd + t.decode_s
    pre, dec, qual = [], [], []
    for unit in space.units:
        p = np.zeros(len(unit.choices))
        d = np.zeros(len(unit.choices))
        q = np.zeros(len(unit.choices))
        for i, choice in enumerate(unit.choices):
            for layer in unit.layers:
                t = cost.layer_time(layer, choice)
                p[i] += t.prefill_s
                d[i] += t.decode_s
                if choice != space.baseline:
                    q[i] += profile.cost(layer.name, choice)
        pre.append(p)
        dec.append(d)
        qual.append(q)
    return Tables(space, tuple(pre), tuple(dec), tuple(qual), cp, cd, cost.workload.output_len,
                  prefill_weight)


__all__ = ["Tables", "build_tables"]
