"""The stages of a search after preparation, each a function over typed values: the uniform
recipes, the calibrated rounds, the choice of the answer and the plan it builds (see
`autoplan.search`).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from autoplan.search.stages._build import SpeedSource, build_plan
from autoplan.search.stages._choose import Chosen, Outcome, certify, choose
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
from autoplan.search.stages._uniform import UNIFORM_TRIES, acceptable, best_uniform, recipes

__all__ = [
    "RECOVERED_SLOPE",
    "SAFETY",
    "UNIFORM_TRIES",
    "USED",
    "Chosen",
    "Outcome",
    "Rounds",
    "SpeedSource",
    "acceptable",
    "best_uniform",
    "build_plan",
    "certify",
    "choose",
    "incumbent",
    "measurement_result",
    "recipes",
    "round_study_name",
    "run_rounds",
    "run_verify_jobs",
    "speed_gain",
]
