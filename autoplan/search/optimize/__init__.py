"""The surrogate problem and its optimizers.

Reasoning and sources: docs/modules.md.
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py), so reading a budget
# or a space file does not import torch and Optuna
_EXPORTS = {
    "KnapsackSolution": "autoplan.search.optimize._knapsack",
    "solve_exact": "autoplan.search.optimize._knapsack",
    "lagrangian_allocations": "autoplan.search.optimize._owl",
    "owl_allocations": "autoplan.search.optimize._owl",
    "ExchangeSampler": "autoplan.search.optimize._sampler",
    "DecisionUnit": "autoplan.search.optimize._space",
    "SearchSpace": "autoplan.search.optimize._space",
    "SpaceFile": "autoplan.search.optimize._space",
    "build_space": "autoplan.search.optimize._space",
    "load_space_file": "autoplan.search.optimize._space",
    "Candidate": "autoplan.search.optimize._study",
    "RoundStudy": "autoplan.search.optimize._study",
    "StudyConfig": "autoplan.search.optimize._study",
    "StudyResult": "autoplan.search.optimize._study",
    "run_batch": "autoplan.search.optimize._study",
    "run_study": "autoplan.search.optimize._study",
    "stored_by": "autoplan.search.optimize._study",
    "CONSTRAINT_KEY": "autoplan.search.optimize._table_study",
    "TableStudy": "autoplan.search.optimize._table_study",
    "Tables": "autoplan.search.optimize._tables",
    "build_tables": "autoplan.search.optimize._tables",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

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
