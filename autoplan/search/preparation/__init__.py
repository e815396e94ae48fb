"""What a search needs before its first trial: the model, data and profile once, then per
target and runtime the kernel times, cost model, tables, the model as is and the speed
prediction's uncertainty (see `autoplan.search`).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from autoplan.search.preparation._as_is import AsIs, as_is
from autoplan.search.preparation._prepare import (
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
from autoplan.search.preparation._scope import profile_scope
from autoplan.search.preparation._uncertainty import SpeedUncertainty, kernel_spread, speed_uncertainty

__all__ = [
    "CALIB_BATCH",
    "AsIs",
    "ModelWork",
    "Prepared",
    "SharedWork",
    "SpeedUncertainty",
    "as_is",
    "kernel_spread",
    "model_work",
    "open_model_work",
    "platform_space",
    "prepare",
    "prepare_platform",
    "prepare_shared",
    "profile_scope",
    "profile_spaces",
    "speed_uncertainty",
    "study_name",
]
