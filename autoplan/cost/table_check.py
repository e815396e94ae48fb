"""A measured cost table (benchmarks/gpu_check.sh) against the analytic GEMM time.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoplan.cost.efficiency import baseline_precision, family_efficiency
from autoplan.cost.linear import call_overhead, gemm_time
from autoplan.cost.measured import MeasuredTable
from autoplan.errors import UnsupportedFormatError
from autoplan.formats import Choice
from autoplan.targets import Target

DISAGREE = 0.15


@dataclass(frozen=True)
class RowCheck:
    """One measured GEMM and its analytic prediction."""

    m: int
    n: int
    k: int
    choice: str
    kernel: str
    measured_s: float
    predicted_s: float | None  # None: the target cannot run the choice (see `why`)
    bound: str  # "memory" | "compute" | "-"
    why: str = ""

    @property
    def error(self) -> float | None:
        """Signed relative error of the prediction against the measurement."""
        if self.predicted_s is None:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class ClassCheck:
    """The rows of one kernel class (choice x analytic bound) and their error."""

    choice: str
    bound: str
    kernels: tuple[str, ...]
    rows: int
    mape: float
    mean_error: float  # signed: the direction a correction would move the model
    worst: RowCheck

    @property
    def disagrees(self) -> bool:
        """More than DISAGREE mean absolute error: a correction candidate."""
        return self.mape > DISAGREE


@dataclass(frozen=True)
class TableCheck:
    """A whole table: every row, every class, and the overall MAPE."""

    target: str
    device: str
    rows: tuple[RowCheck, ...]
    classes: tuple[ClassCheck, ...]

    @property
    def mape(self) -> float:
        """Mean absolute error over every predicted row."""
        errs = [abs(r.error) for r in self.rows if r.error is not None]
        return sum(errs) / len(errs) if errs else float("nan")

    def to_json(self) -> dict[str, Any]:
        """A plain document (`autoplan validate --cost-table --json`)."""
        def row(r: RowCheck) -> dict[str, Any]:
            return {"m": r.m, "n": r.n, "k": r.k, "choice": r.choice, "kernel": r.kernel,
                    "measured_us": r.measured_s * 1e6, "bound": r.bound,
                    "predicted_us": None if r.predicted_s is None else r.predicted_s * 1e6,
                    "error": r.error, **({"why": r.why} if r.why else {})}
        return {
            "target": self.target, "device": self.device, "threshold": DISAGREE,
            "mape": self.mape, "rows": [row(r) for r in self.rows],
            "classes": [{"choice": c.choice, "bound": c.bound, "kernels": list(c.kernels),
                         "rows": c.rows, "mape": c.mape, "mean_error": c.mean_error,
                         "disagrees": c.disagrees, "worst": row(c.worst)}
                        for c in self.classes],
        }


def check_cost_table(doc: Mapping[str, Any], target: Target) -> TableCheck:
    """Predict every row of a measured cost table on `target` and group the errors.

    Raises:
        UserInputError: the document is not a valid cost table (MeasuredTable's checks).
    """
    MeasuredTable.from_document(doc)  # the same validation `search --cost-table` applies
    eff = family_efficiency(target)
    base = baseline_precision(target)
    rows: list[RowCheck] = []
    for raw in doc["rows"]:
        m, n, k = int(raw["m"]), int(raw["n"]), int(raw["k"])
        choice = Choice.parse(str(raw["choice"]))
        measured = float(raw["median_us"]) * 1e-6
        kernel = str(raw.get("kernel", "?"))
        try:
            g = gemm_time(target, eff, choice, m, n, k, base)
        except UnsupportedFormatError as exc:
            rows.append(RowCheck(m, n, k, str(choice), kernel, measured, None, "-", str(exc)))
            continue
        predicted = g.seconds + call_overhead(target, eff, choice)
        rows.append(RowCheck(m, n, k, str(choice), kernel, measured, predicted, g.bound))
    groups: dict[tuple[str, str], list[RowCheck]] = defaultdict(list)
    for r in rows:
        if r.error is not None:
            groups[(r.choice, r.bound)].append(r)
    classes = []
    for (choice, bound), members in sorted(groups.items()):
        errs = [r.error for r in members]
        classes.append(ClassCheck(
            choice, bound, tuple(sorted({r.kernel for r in members})), len(members),
            sum(abs(e) for e in errs) / len(errs), sum(errs) / len(errs),
            max(members, key=lambda r: abs(r.error))))
    return TableCheck(target.name, str(doc.get("device", "?")), tuple(rows), tuple(classes))


__all__ = ["DISAGREE", "ClassCheck", "RowCheck", "TableCheck", "check_cost_table"]
