"""Plan files: schema and atomic, version-checked I/O (the one plan reader)."""

from autoplan.plan.io import PlanInput, load_plan, read_plan, save_plan, write_json_atomic
from autoplan.plan.schema import SCHEMA_VERSION, Plan

__all__ = ["SCHEMA_VERSION", "Plan", "PlanInput", "load_plan", "read_plan", "save_plan",
           "write_json_atomic"]
