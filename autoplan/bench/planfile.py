"""Read the decisions of a plan for apply/bench: a full plan file or a minimal mapping.

Kept in one small function so the CLI commands do not depend on the plan schema's details:
a full plan (autoplan/plan/schema.py) is validated by `load_plan`; a file without
`schema_version` may be a minimal `{"decisions": {layer: "sparsity+precision"}}` (with an
optional "target" and "model") or a bare `{layer: "sparsity+precision"}` mapping.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import PlanError
from autoplan.formats import Choice


@dataclass(frozen=True)
class PlanInput:
    """What apply and bench need from a plan."""

    decisions: dict[str, Choice]
    target: str | None  # None: the plan does not say
    model_id: str | None  # the plan's model argument, when it names one
    content_hash: str | None  # model content hash the plan was made for, when known
    text: str  # the file as read, copied into artifacts for the audit trail
    full: Any = None  # the validated autoplan.plan.Plan for full plan files, else None


def read_plan(path: str | Path) -> PlanInput:
    """Parse `path` into a PlanInput; PlanError (exit 2) names what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"no plan file at '{path}'")
    text = p.read_text()
    try:
        raw: Any = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path} must hold a JSON object")
    if "schema_version" in raw:
        from autoplan.plan import load_plan

        plan = load_plan(p)
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
        out[str(layer)] = Choice.parse(text)
    return out


__all__ = ["PlanInput", "read_plan"]
