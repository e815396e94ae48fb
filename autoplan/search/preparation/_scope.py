"""Which layers and choices to profile for a target: the union of every runtime's search
space on that target, so one profile serves plans for all of them (or one runtime's space)."""

from __future__ import annotations

from autoplan.errors import UnsupportedFormatError
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec
from autoplan.runtimes import get_runtime, runtime_names
from autoplan.search.optimize import build_space
from autoplan.targets import Target


def profile_scope(spec: ModelSpec, target: Target, runtime: str | None = None
                  ) -> tuple[list[str], list[Choice], Choice]:
    """(layer names, non-baseline choices, baseline) to profile on `target`."""
    runtimes = [get_runtime(runtime).name] if runtime else runtime_names()
    layers: dict[str, None] = {}
    choices: dict[Choice, None] = {}
    baseline = None
    for rt in runtimes:
        try:
            space = build_space(spec, target, rt)
        except UnsupportedFormatError:
            continue
        baseline = space.baseline
        for unit in space.units:
            layers.update(dict.fromkeys(la.name for la in unit.layers))
            choices.update(dict.fromkeys(c for c in unit.choices if c != space.baseline))
    if baseline is None:
        raise UnsupportedFormatError(f"no runtime accelerates a compressed format on {target.name}")
    return list(layers), list(choices), baseline


__all__ = ["profile_scope"]
