"""Reading and writing plan files: JSON with sorted keys, written atomically,
schema-version checked on load (older migrated, newer refused).

The one plan reader: ``load_plan`` validates a full plan; ``read_plan`` also accepts what
``apply``, ``bench`` and ``fleet`` take besides a full plan -- a minimal
``{"decisions": {layer: "sparsity+precision"}}`` (with an optional "target" and "model") or
a bare ``{layer: "sparsity+precision"}`` mapping.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoplan.atomic import write_json_atomic
from autoplan.errors import PlanError, UserInputError
from autoplan.formats import Choice
from autoplan.plan.schema import SCHEMA_VERSION, Plan


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 2 typed the rounds, points, workload and operating point that version 1 kept
    as free-form dicts; their keys are the same (a front point's lower-bound flag, absent
    in version 1, defaults to None)."""
    return {**raw, "schema_version": 2}


def _v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 3 added the KV cache, the deploy command and the long-prompt KL, all optional:
    a version 2 plan had the runtime's own cache and no command (None)."""
    return {**raw, "schema_version": 3}


def _v3_to_v4(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 4 added the search's stop reason, the noise rule's why, the per-family
    calibration, the speed uncertainty and the quality reference, all with defaults."""
    return {**raw, "schema_version": 4}


def _v4_to_v5(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 5 records the machine a `local` plan was searched on; a version 4 plan does
    not say (None), so nothing reuses its local figures as this machine's."""
    return {**raw, "schema_version": 5}


# from_version -> function upgrading a raw dict by one version; load_plan applies them in
# order, so a v1 plan keeps loading after every future bump.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2,
                                                                      2: _v2_to_v3,
                                                                      3: _v3_to_v4,
                                                                      4: _v4_to_v5}


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


def _read_object(path: str | Path) -> tuple[str, dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"no plan file at '{path}'")
    try:
        text = p.read_text()
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:  # nesting deeper than any plan: not one
        raise PlanError(f"{path} is not an autoplan plan (JSON nested too deeply)") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path} is not an autoplan plan (expected a JSON object)")
    return text, raw


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; errors are one line and name the problem (also a
    layer in a format this autoplan does not know: nothing could run or render it)."""
    plan = _validate(_read_object(path)[1], path)
    _choices(plan.decisions, path)
    return plan


def _validate(raw: dict[str, Any], path: str | Path) -> Plan:
    try:
        return Plan.model_validate(migrate(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise PlanError(f"{path} is not a valid plan: {where}: {first['msg']}") from None


@dataclass(frozen=True)
class PlanInput:
    """What apply, bench and fleet need from a plan file, full or minimal.

    Attributes:
        decisions: layer -> Choice.
        target: the plan's target name, or None when a minimal plan does not say.
        model_id: the model the plan names, when it names one (never opened as a path:
            only paths the user passes on the command line are read).
        content_hash: the model content hash a full plan was made for.
        text: the file as read, copied into artifacts for the audit trail.
        full: the validated Plan of a full plan file, else None.
    """

    decisions: dict[str, Choice]
    target: str | None
    model_id: str | None
    content_hash: str | None
    text: str
    full: Plan | None = None


def read_plan(path: str | Path) -> PlanInput:
    """Read a full or minimal plan file; PlanError (exit 2) names what is wrong."""
    text, raw = _read_object(path)
    if "schema_version" in raw:
        plan = _validate(raw, path)
        return PlanInput(_choices(plan.decisions, path), plan.target.name, plan.model.id,
                         plan.model.content_hash, text, plan)
    mapping = raw.get("decisions", raw)
    target = raw.get("target") if "decisions" in raw else None
    if isinstance(target, dict):
        target = target.get("name")
    model = raw.get("model") if "decisions" in raw else None
    if isinstance(model, dict):
        model = model.get("id")
    return PlanInput(_choices(mapping, path), target, model, None, text)


def _choices(mapping: Any, path: str | Path) -> dict[str, Choice]:
    if not isinstance(mapping, dict) or not mapping:
        raise PlanError(f"{path} has no decisions: expected {{\"decisions\": {{layer: "
                        "\"sparsity+precision\"}}}")
    out: dict[str, Choice] = {}
    for layer, text in mapping.items():
        if not isinstance(text, str):
            raise PlanError(f"{path}: decision for '{layer}' must be a string like 'dense+int8'")
        try:
            out[str(layer)] = Choice.parse(text)
        except UserInputError as exc:
            raise PlanError(f"{path}: layer '{layer}' has format '{text}': {exc}") from None
    return out


__all__ = ["MIGRATIONS", "PlanInput", "load_plan", "migrate", "read_plan", "save_plan",
           "write_json_atomic"]
