"""The stages of a search, each a function over typed values (see `autoplan.search`).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from autoplan.search.stages._build import SpeedSource, build_plan
from autoplan.search.stages._choose import Chosen, Outcome, best_uniform, choose, certify
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
    "ModelWork",
    "Outcome",
    "Prepared",
    "RECOVERED_SLOPE",
    "Rounds",
    "SAFETY",
    "SharedWork",
    "SpeedSource",
    "best_uniform",
    "build_plan",
    "certify",
    "choose",
    "measurement_result",
    "model_work",
    "open_model_work",
    "platform_space",
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
