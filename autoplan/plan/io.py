"""Reading and writing plan files: JSON with sorted keys, written atomically,
schema-version checked on load (older migrated, newer refused)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoplan.atomic import write_json_atomic
from autoplan.errors import PlanError
from autoplan.plan.schema import SCHEMA_VERSION, Plan

# from_version -> function upgrading a raw dict by one version. Empty until schema 2 exists;
# load_plan applies them in order, so a v1 plan keeps loading after every future bump.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def save_plan(plan: Plan, path: str | Path) -> None:
    write_json_atomic(path, plan.model_dump(mode="json"))


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring a raw plan dict up to SCHEMA_VERSION, or refuse a newer one."""
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise PlanError("not an autoplan plan: no integer 'schema_version'")
    if version > SCHEMA_VERSION:
        raise PlanError(
            f"plan has schema_version {version} but this autoplan reads up to {SCHEMA_VERSION}: "
            "upgrade autoplan (pip install -U autoplan)"
        )
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise PlanError(f"no migration from plan schema_version {version}")
        raw = MIGRATIONS[version](raw)
        version = raw["schema_version"]
    return raw


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; errors are one line and name the problem."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"no plan file at '{path}'")
    try:
        raw = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path} is not an autoplan plan (expected a JSON object)")
    try:
        return Plan.model_validate(migrate(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise PlanError(f"{path} is not a valid plan: {where}: {first['msg']}") from None


__all__ = ["MIGRATIONS", "load_plan", "migrate", "save_plan", "write_json_atomic"]
