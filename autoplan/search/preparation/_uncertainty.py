"""How far a predicted speed ratio between two plans may be off, per target and runtime: the
bar a plan's predicted gain must clear before it may spend quality (the noise rule, _choose).

- `local`, kernels timed: their repeatability (ONNX Runtime rows' p10-p90; llama.cpp rows'
  two interleaved halves, ``halves_us``), time-weighted over the rows the search uses.
- A catalog target: the cost model's mean absolute error on published speedups of its
  hardware family and model kind (`autoplan validate`, cost/validate.family_error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.cost.efficiency import family_of
from autoplan.cost.validate import family_error


@dataclass(frozen=True)
class SpeedUncertainty:
    """A relative uncertainty of predicted speed ratios (0.097: +-9.7 %) and its source."""

    relative: float
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"relative": self.relative, "source": self.source}


def _interval(row: dict[str, Any]) -> tuple[float, float]:
    if "halves_us" in row:
        lo, hi = row["halves_us"]
        return float(lo), float(hi)
    return float(row["p10_us"]), float(row["p90_us"])


def kernel_spread(table: dict[str, Any]) -> tuple[float, int] | None:
    """(sum of the rows' half spreads / sum of their times, rows), or None when the table
    holds no row with a spread (a cost table given without one). A row's spread is its
    ``halves_us`` where it has them, else p10 to p90."""
    rows = [r for r in table.get("rows", []) if {"median_us", "p10_us", "p90_us"} <= set(r)
            or {"median_us", "halves_us"} <= set(r)]
    total = sum(float(r["median_us"]) for r in rows)
    if not rows or total <= 0:
        return None
    spread = sum((hi - lo) / 2 for lo, hi in map(_interval, rows))
    return spread / total, len(rows)


def speed_uncertainty(target: Any, kernel_times: dict[str, Any] | None,
                      kernels_label: str | None = None, moe: bool = False) -> SpeedUncertainty:
    """The uncertainty of the speed figures a search predicts with (see module doc)."""
    measured = kernel_spread(kernel_times) if kernel_times else None
    if measured is not None:
        spread, n = measured
        what = f"{kernels_label} kernels" if kernels_label else "measured GEMM times"
        rows = kernel_times.get("rows", []) if kernel_times else []
        which = "of the interleaved halves' times" if any("halves_us" in r for r in rows) \
            else "p10 to p90"
        return SpeedUncertainty(spread, f"repeatability of the {n} {what} timed for this "
                                        f"search: time-weighted half spread, {which}")
    family = family_of(target)
    mape, n, which = family_error(family, moe)
    return SpeedUncertainty(mape, f"autoplan validate: mean |error| of {n} published speedups "
                                  f"{which}")


__all__ = ["SpeedUncertainty", "kernel_spread", "speed_uncertainty"]
