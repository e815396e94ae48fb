"""The surrogate calibrated per format family: measured badness ~= sum over families of
scale[family] x that family's share of the surrogate, fitted from every full measurement
(a hierarchical prior keeps it stable on few). Reasoning: docs/modules.md,
docs/search-quality.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from autoplan.formats import Choice
from autoplan.search.optimize import Tables

# Log-scale spreads of the fit. SIGMA: how far one measurement strays from an additive
# prediction with the right scale (the log of measured/surrogate KL has a standard deviation
# of 0.14 over 32 mixed plans on SmolLM2-135M, docs/benchmarks.md "Surrogate fidelity",
# family differences included). TAU: how far a family's scale may sit from the global one
# (the +-25 % of issue 30's Gemma and SmolLM2 runs is half a TAU); one full measurement of
# a family then moves its log scale TAU^2 / (TAU^2 + SIGMA^2) = 92 % of the way.
# PRIOR_SPREAD: the global scale's prior around the budget's prior slope (x/ e^0.5).
SIGMA = 0.15
TAU = 0.5
PRIOR_SPREAD = 0.5


def format_family(choice: Choice) -> str:
    """The family a choice's surrogate error is fitted with: its sparsity pattern when it
    prunes, else its weight bits, whether its activations are quantized, FP4 apart."""
    if choice.sparsity.kind != "dense":
        pattern = f"{choice.sparsity.n}:{choice.sparsity.m}" if choice.sparsity.kind == "nm" \
            else choice.sparsity.kind
        return f"sparse {pattern}"
    info = choice.precision.info
    if info.value_bits >= 16:
        return "16-bit"
    if info.value_bits >= 8:
        return "8-bit"
    if info.math == "fp4":
        return "fp4"
    kind = "weight-only" if info.weight_only else "with activations"
    return f"{info.value_bits}-bit {kind}"


def family_shares(tables: Tables, picks: Sequence[int]) -> dict[str, float]:
    """The surrogate of `picks` split by family (families with a zero share left out)."""
    out: dict[str, float] = {}
    for unit, (q, c) in zip(tables.space.units, zip(tables.quality, picks, strict=True),
                            strict=True):
        value = float(q[c])
        if value > 0:
            fam = format_family(unit.choices[c])
            out[fam] = out.get(fam, 0.0) + value
    return out


@dataclass(frozen=True)
class Observation:
    """One measurement as the fit sees it: surrogate shares by family and measured badness
    (`lower_bound`: the pass stopped early, the badness is at least this)."""

    shares: dict[str, float]
    badness: float
    lower_bound: bool = False


@dataclass(frozen=True)
class Calibration:
    """Measured badness per surrogate nat, per family (a family never measured: `base`)."""

    base: float  # the global scale
    scales: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # observations informing each
    observations: int = 0

    def scale(self, family: str) -> float:
        return self.scales.get(family, self.base)

    def predict(self, shares: dict[str, float]) -> float:
        """Predicted badness of a candidate with these surrogate shares."""
        return sum(self.scale(f) * v for f, v in shares.items())

    def tables(self, tables: Tables) -> Tables:
        """The calibrated problem: every quality entry scaled by its family's scale, so the
        tables' surrogate is the predicted badness."""
        return scaled_tables(tables, self.scales, self.base)

    def to_json(self) -> dict:
        return {"base": self.base, "scales": dict(sorted(self.scales.items())),
                "observations": self.observations, "counts": dict(sorted(self.counts.items()))}


def scaled_tables(tables: Tables, scales: dict[str, float], base: float) -> Tables:
    """`tables` with each unit x choice quality entry multiplied by its family's scale (the
    calibrated problem the study, the warm starts and the certificate solve)."""
    quality = tuple(
        np.array([float(q[i]) * scales.get(format_family(c), base)
                  for i, c in enumerate(unit.choices)])
        for unit, q in zip(tables.space.units, tables.quality, strict=True))
    return replace(tables, quality=quality)


def fit_calibration(observations: Iterable[Observation], prior: float) -> Calibration:
    """The per-family scales (MAP under the priors above) from every usable observation:
    positive badness and a positive surrogate. With none, every scale is `prior`."""
    obs = [o for o in observations if o.badness > 0 and sum(o.shares.values()) > 0]
    if not obs:
        return Calibration(prior)
    families = sorted({f for o in obs for f in o.shares})
    index = {f: i for i, f in enumerate(families)}
    rows = np.zeros((len(obs), len(families)))
    for r, o in enumerate(obs):
        for f, v in o.shares.items():
            rows[r, index[f]] = v
    logy = np.log([o.badness for o in obs])
    bound = np.array([o.lower_bound for o in obs])
    log_prior = math.log(prior)

    def residuals(theta: np.ndarray) -> np.ndarray:
        log_g, delta = theta[0], theta[1:]
        pred = np.log(rows @ np.exp(log_g + delta))
        err = (pred - logy) / SIGMA
        err = np.where(bound, np.minimum(err, 0.0), err)  # a bound only pushes up
        return np.concatenate([err, delta / TAU, [(log_g - log_prior) / PRIOR_SPREAD]])

    start = np.zeros(len(families) + 1)
    start[0] = log_prior
    fit = least_squares(residuals, start, method="trf")
    log_g = float(fit.x[0])
    scales = {f: math.exp(log_g + float(fit.x[1 + i])) for i, f in enumerate(families)}
    counts = {f: int((rows[:, i] > 0).sum()) for i, f in enumerate(families)}
    return Calibration(math.exp(log_g), scales, counts, len(obs))


__all__ = [
    "SIGMA",
    "TAU",
    "Calibration",
    "Observation",
    "family_shares",
    "fit_calibration",
    "format_family",
    "scaled_tables",
]
