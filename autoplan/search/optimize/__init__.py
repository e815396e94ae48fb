"""The surrogate problem and its optimizers.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from autoplan.search.optimize._knapsack import KnapsackSolution, solve_exact
from autoplan.search.optimize._owl import lagrangian_allocations, owl_allocations
from autoplan.search.optimize._sampler import ExchangeSampler
from autoplan.search.optimize._space import (
    DecisionUnit,
    SearchSpace,
    SpaceFile,
    build_space,
    load_space_file,
)
from autoplan.search.optimize._study import (
    Candidate,
    RoundStudy,
    StudyConfig,
    StudyResult,
    run_batch,
    run_study,
    stored_by,
)
from autoplan.search.optimize._table_study import CONSTRAINT_KEY, TableStudy
from autoplan.search.optimize._tables import Tables, build_tables

__all__ = [
    "CONSTRAINT_KEY",
    "Candidate",
    "DecisionUnit",
    "ExchangeSampler",
    "KnapsackSolution",
    "RoundStudy",
    "SearchSpace",
    "SpaceFile",
    "StudyConfig",
    "StudyResult",
    "TableStudy",
    "Tables",
    "build_space",
    "build_tables",
    "lagrangian_allocations",
    "load_space_file",
    "owl_allocations",
    "run_batch",
    "run_study",
    "solve_exact",
    "stored_by",
]
