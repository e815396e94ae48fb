"""The stages of a search, each a function over typed values (see `autoplan.search`).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from autoplan.search.stages._as_is import AsIs, as_is
from autoplan.search.stages._build import SpeedSource, build_plan
from autoplan.search.stages._choose import Chosen, Outcome, certify, choose
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
    USED,
    Rounds,
    incumbent,
    measurement_result,
    round_study_name,
    run_rounds,
    run_verify_jobs,
    speed_gain,
)
from autoplan.search.stages._scope import profile_scope
from autoplan.search.stages._uncertainty import SpeedUncertainty, kernel_spread, speed_uncertainty
from autoplan.search.stages._uniform import UNIFORM_TRIES, acceptable, best_uniform, recipes

__all__ = [
    "CALIB_BATCH",
    "RECOVERED_SLOPE",
    "SAFETY",
    "UNIFORM_TRIES",
    "USED",
    "AsIs",
    "Chosen",
    "ModelWork",
    "Outcome",
    "Prepared",
    "Rounds",
    "SharedWork",
    "SpeedSource",
    "SpeedUncertainty",
    "acceptable",
    "as_is",
    "best_uniform",
    "build_plan",
    "certify",
    "choose",
    "incumbent",
    "kernel_spread",
    "measurement_result",
    "model_work",
    "open_model_work",
    "platform_space",
    "prepare",
    "prepare_platform",
    "prepare_shared",
    "profile_scope",
    "profile_spaces",
    "recipes",
    "round_study_name",
    "run_rounds",
    "run_verify_jobs",
    "speed_gain",
    "speed_uncertainty",
    "study_name",
]
