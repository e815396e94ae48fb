"""Plan files: schema and atomic, version-checked I/O."""

from autoplan.plan.io import load_plan, save_plan, write_json_atomic
from autoplan.plan.schema import SCHEMA_VERSION, Plan

__all__ = ["SCHEMA_VERSION", "Plan", "load_plan", "save_plan", "write_json_atomic"]
