"""Measured GEMM times (microbenchmark JSON) that replace the analytic linear time.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoplan.errors import UserInputError
from autoplan.formats import Choice


@dataclass(frozen=True)
class MeasuredTable:
    """(m, n, k, choice) -> seconds; `includes_dispatch`: rows already hold the per-kernel
    overhead (the cost model then does not add it again)."""

    rows: dict[tuple[int, int, int, Choice], float] = field(default_factory=dict)
    includes_dispatch: bool = False
    # Measured seconds of everything but the linear layers in one decode step (the
    # document's "non_gemm_decode_s"); replaces the analytic fixed decode terms.
    non_gemm_decode_s: float | None = None
    # How the source stores the input embedding where the artifact keeps it as it is (a
    # GGUF export copies token_embd): bits per weight, and the planned choice of that type
    # (None: a type autoplan does not plan). None: the cost model's baseline.
    embedding_bits: float | None = None
    embedding_choice: Choice | None = None

    @classmethod
    def from_document(cls, doc: Mapping[str, Any] | None) -> MeasuredTable:
        """Read a microbenchmark document (or None for no measurements)."""
        if doc is None or (isinstance(doc, Mapping) and not doc):
            return cls()
        if not isinstance(doc, Mapping):
            raise UserInputError(f"a measured table is a JSON object with \"rows\", not a "
                                 f"{type(doc).__name__}; pass the cost_table.json written by "
                                 "benchmarks/gpu_check.sh")
        version = doc.get("schema_version", 1)
        if version != 1:
            raise UserInputError(f"measured table schema_version {version} is not supported "
                                 "(this autoplan reads 1); re-run the microbenchmark")
        rows: dict[tuple[int, int, int, Choice], float] = {}
        doc_rows = doc.get("rows", [])
        if not isinstance(doc_rows, list):
            raise UserInputError("a measured table's \"rows\" must be a list of {m, n, k, "
                                 "choice, median_us} objects")
        for i, row in enumerate(doc_rows):
            try:
                key = (int(row["m"]), int(row["n"]), int(row["k"]), Choice.parse(str(row["choice"])))
                seconds = float(row["median_us"]) * 1e-6
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise UserInputError(f"measured row {i} is malformed ({exc}); each row needs "
                                     "m, n, k, choice and median_us") from None
            if not 0 < seconds < float("inf"):
                raise UserInputError(f"measured row {i} has a non-positive or non-finite "
                                     "median_us")
            rows[key] = seconds
        fixed = doc.get("non_gemm_decode_s")
        if fixed is not None and not _positive_finite(fixed):
            raise UserInputError("measured non_gemm_decode_s must be a finite number > 0")
        embedding = doc.get("embedding") or {}
        if not isinstance(embedding, Mapping):
            raise UserInputError("a measured table's \"embedding\" must be an object with "
                                 "\"bits\" and \"choice\" (how the source stores it)")
        bits, choice = embedding.get("bits"), embedding.get("choice")
        if bits is not None and (isinstance(bits, bool) or not _positive_finite(bits)):
            raise UserInputError("measured embedding bits must be a finite number > 0")
        return cls(rows, bool(doc.get("includes_dispatch", False)),
                   None if fixed is None else float(fixed),
                   None if bits is None else float(bits),
                   Choice.parse(str(choice)) if choice else None)

    def seconds(self, m: int, n: int, k: int, choice: Choice) -> float | None:
        """The measured time of this GEMM, or None."""
        if not self.rows:
            return None
        return self.rows.get((m, n, k, choice))

    def __len__(self) -> int:
        return len(self.rows)


def _positive_finite(value: Any) -> bool:
    try:
        return 0 < float(value) < float("inf")
    except (TypeError, ValueError):
        return False


def load_cost_table(path: str | None) -> dict | None:
    """Read a measured cost table file (`benchmarks/gpu_check.sh` / backends.microbench
    output) for CostModel(measured=...); None passes through.

    The whole document is validated here, before any work: a file the search would silently
    ignore (not an object, no rows, a malformed row) is refused, because the plan would
    otherwise claim measured GEMM times it never used.

    Raises:
        UserInputError: one line naming the problem and the file to pass instead.
    """
    if path is None:
        return None
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise UserInputError(f"no cost table at '{path}': pass the cost_table.json written by "
                             "benchmarks/gpu_check.sh")
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise UserInputError(f"cannot read the cost table {path}: {exc.strerror}") from None
    if not isinstance(doc, dict) or not doc.get("rows"):
        raise UserInputError(f"{path} holds no measured rows (a cost table is {{\"rows\": "
                             "[{m, n, k, choice, median_us}, ...]}): pass the cost_table.json "
                             "written by benchmarks/gpu_check.sh")
    try:
        MeasuredTable.from_document(doc)
    except UserInputError as exc:
        raise UserInputError(f"{path}: {exc}") from None
    return doc


__all__ = ["MeasuredTable", "load_cost_table"]
