"""Recovery passes: finalists measured after training towards the original (`--recover`),
and `autoplan recover PLAN` on a finished plan.

    RecoveryStage(settings, text, model_hash, work_dir, rep)   the Verifier's recovery hook
    recover_plan(plan, loaded, RecoverOptions) -> Plan          a new, recovered plan
"""

from __future__ import annotations

from autoplan.search.recovery._recover_plan import RecoverOptions, default_out, recover_plan
from autoplan.search.recovery._stage import (
    PassOutput,
    RecoveryStage,
    RecoveryText,
    keep_weights,
    plan_quality,
    recovered_model,
    recovery_text,
    run_key,
    run_pass,
    work_dir_for,
)

__all__ = [
    "PassOutput",
    "RecoverOptions",
    "RecoveryStage",
    "RecoveryText",
    "default_out",
    "keep_weights",
    "plan_quality",
    "recover_plan",
    "recovered_model",
    "recovery_text",
    "run_key",
    "run_pass",
    "work_dir_for",
]
