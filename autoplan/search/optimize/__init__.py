"""The surrogate problem and its optimizers.

    build_space(spec, target, runtime) -> SearchSpace   decision units and their choices
    build_tables(space, cost, profile) -> Tables        time and surrogate KL per unit x choice
    run_study(tables, limit, cost, StudyConfig, warm) -> StudyResult
                                                        Optuna study (ExchangeSampler on
                                                        TableStudy; NSGA-II for a front)
    solve_exact(tables, limit) -> KnapsackSolution      the additive problem's exact optimum
    owl_allocations / lagrangian_allocations            warm starts
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
