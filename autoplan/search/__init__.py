"""`autoplan search`: each layer's format chosen under a quality budget, as a library.

A search is a pipeline of stages, each a function over typed values (``request/`` holds
the first two lines, ``preparation/`` the next two, ``stages/`` the rest):

    SearchRequest(model, target, budget, ...)        every input, checked when it is built
    preflight(req) -> Platform                       bad input refused before any work
    prepare_shared(reqs, platforms, rep) -> SharedWork
                                                     the model, one SearchSpace per platform,
                                                     ONE profile, the original measured
    prepare_platform(req, platform, shared, space, rep) -> Prepared
                                                     cost model, Tables, Verifier, study name
    run_rounds(prep, rep, queue) -> Rounds           study on the surrogate -> verify the best
                                                     candidates -> refit, round by round
    choose(prep, rounds, rep) -> Chosen              the fallback policy (plan, uniform, baseline)
    certify(prep, rounds, rep) -> Certificate | None the additive problem's exact optimum, the gap
    build_plan(prep, rounds, chosen, cert, wall_s) -> Plan

``Pipeline(requests).run()`` runs them for one model on one or more platforms, each through
its job queue, and writes the plans (yields ``Searched``, or ``Skipped`` for a platform the
model does not fit); ``run_search(req)`` is the pipeline on one platform, ``autoplan compare``
on several; ``run_worker`` joins a running search (``run/``). The subpackages, each
importing only those listed before it:

    jobs/      the Optuna storage and the job queue processes share
    optimize/  SearchSpace, Tables, the Optuna study and sampler, the exact (MILP) solver
    verify/    QualityBudget, the Verifier measuring candidates on the real model, its cache
    recovery/  recovery passes (`--recover`, `autoplan recover PLAN`)
    request/   SearchRequest and preflight
    preparation/ the model, profile and per-platform tables before any trial
    stages/    uniform recipes, calibrated rounds, the answer and its plan
    run/       Pipeline, run_search (the driver), run_worker, the record workers read

`reporter` (progress sink), `writable` (can a file be written?) and `storage_url` (a
storage URL checked without Optuna) sit below all of them.
docs/architecture.md, "Search pipeline", says what each stage does.
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py), so reading a budget
# or a space file does not import torch and Optuna
_EXPORTS = {
    "DecisionUnit": "autoplan.search.optimize",
    "SearchSpace": "autoplan.search.optimize",
    "build_space": "autoplan.search.optimize",
    "load_space_file": "autoplan.search.optimize",
    "RecoverOptions": "autoplan.search.recovery",
    "recover_plan": "autoplan.search.recovery",
    "Reporter": "autoplan.search.reporter",
    "Pipeline": "autoplan.search.run",
    "SearchOutcome": "autoplan.search.run",
    "Searched": "autoplan.search.run",
    "Skipped": "autoplan.search.run",
    "run_search": "autoplan.search.run",
    "run_worker": "autoplan.search.run",
    "Chosen": "autoplan.search.stages",
    "CostTable": "autoplan.search.request",
    "ExecutionSettings": "autoplan.search.request",
    "Outcome": "autoplan.search.stages",
    "Platform": "autoplan.search.request",
    "Prepared": "autoplan.search.preparation",
    "Rounds": "autoplan.search.stages",
    "SearchRequest": "autoplan.search.request",
    "build_plan": "autoplan.search.stages",
    "certify": "autoplan.search.stages",
    "choose": "autoplan.search.stages",
    "parse_choices": "autoplan.search.request",
    "preflight": "autoplan.search.request",
    "prepare": "autoplan.search.preparation",
    "profile_scope": "autoplan.search.preparation",
    "run_rounds": "autoplan.search.stages",
    "Measurement": "autoplan.search.verify",
    "QualityBudget": "autoplan.search.verify",
    "Verifier": "autoplan.search.verify",
    "check_writable_file": "autoplan.search.writable",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

__all__ = [
    "Chosen",
    "CostTable",
    "DecisionUnit",
    "ExecutionSettings",
    "Measurement",
    "Outcome",
    "Pipeline",
    "Platform",
    "Prepared",
    "QualityBudget",
    "RecoverOptions",
    "Reporter",
    "Rounds",
    "SearchOutcome",
    "Searched",
    "SearchRequest",
    "SearchSpace",
    "Skipped",
    "Verifier",
    "build_plan",
    "build_space",
    "certify",
    "check_writable_file",
    "choose",
    "load_space_file",
    "parse_choices",
    "preflight",
    "prepare",
    "profile_scope",
    "recover_plan",
    "run_rounds",
    "run_search",
    "run_worker",
]
