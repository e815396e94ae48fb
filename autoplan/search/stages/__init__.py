"""The stages of a search, each a function over typed values (see `autoplan.search`).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from autoplan.search.stages._build import SpeedSource, build_plan
from autoplan.search.stages._choose import Chosen, Outcome, best_uniform, choose, certify
from autoplan.search.stages._preflight import (
    Platform,
    UnfitBaseline,
    check_model,
    fits_reference,
    in_memory_only,
    kernel_timer,
    measures_kernels,
    operating_point,
    preflight,
)
from autoplan.search.stages._prepare import (
    CALIB_BATCH,
    ModelWork,
    Prepared,
    SharedWork,
    model_work,
    open_model_work,
    platform_space,
    prepare,
    prepare_platform,
    prepare_shared,
    profile_spaces,
    study_name,
)
from autoplan.search.stages._request import (
    MAX_SEED,
    CostTable,
    ExecutionSettings,
    SearchRequest,
    at_least,
    parse_choices,
)
from autoplan.search.stages._rounds import (
    RECOVERED_SLOPE,
    SAFETY,
    Rounds,
    measurement_result,
    round_study_name,
    run_rounds,
    run_verify_jobs,
)
from autoplan.search.stages._scope import profile_scope

__all__ = [
    "CALIB_BATCH",
    "Chosen",
    "CostTable",
    "ExecutionSettings",
    "MAX_SEED",
    "ModelWork",
    "Outcome",
    "Platform",
    "UnfitBaseline",
    "Prepared",
    "RECOVERED_SLOPE",
    "Rounds",
    "SAFETY",
    "SearchRequest",
    "SharedWork",
    "SpeedSource",
    "at_least",
    "best_uniform",
    "build_plan",
    "certify",
    "check_model",
    "fits_reference",
    "choose",
    "in_memory_only",
    "kernel_timer",
    "measurement_result",
    "measures_kernels",
    "model_work",
    "open_model_work",
    "operating_point",
    "parse_choices",
    "platform_space",
    "preflight",
    "prepare",
    "prepare_platform",
    "prepare_shared",
    "profile_scope",
    "profile_spaces",
    "round_study_name",
    "run_rounds",
    "run_verify_jobs",
    "study_name",
]
