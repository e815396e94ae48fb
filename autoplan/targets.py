"""Hardware target catalog: one TOML file per target in autoplan/data/targets/,
validated into frozen pydantic models. Unknown keys are rejected; every figure has a source.

Peaks are DENSE tensor/matrix rates (NVIDIA datasheets print 2:4-sparse peaks: hw-facts.md).
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autoplan.errors import AutoplanError, UnknownNameError

MathDtype = Literal["fp32", "bf16", "fp8", "int8", "int4", "fp4"]


class Figure(BaseModel):
    """One number with where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float
    source: str = Field(min_length=1, description="reference key (hw-facts.md §5) or 'measured'")
    uncertain: bool = False
    note: str = ""


class Target(BaseModel):
    """One piece of hardware as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    aliases: tuple[str, ...] = ()
    description: str
    vendor: Literal["nvidia", "amd", "intel", "arm", "cpu-local"]
    kind: Literal["gpu", "cpu"]
    family: str = Field(description="hardware family; efficiency constants are global per family")
    memory_gb: Figure
    bandwidth_gbps: Figure
    peak_tflops: dict[MathDtype, Figure] = Field(description="dense peaks per math dtype")
    sparse24: dict[MathDtype, Figure] = Field(
        default_factory=dict, description="2:4 speedup multiplier of the peak, per math dtype"
    )
    tdp_w: Figure
    price_per_hour: Figure = Field(description="default $/hour for one device (or one socket)")
    cores: int | None = None
    l2_mb: Figure | None = None
    features: tuple[str, ...] = ()
    measured: bool = False

    @field_validator("name")
    @classmethod
    def _lowercase(cls, v: str) -> str:
        if v != v.lower():
            raise ValueError("target names are lowercase")
        return v

    def peak(self, math: str) -> float | None:
        """Dense peak in FLOP/s (or OP/s) for a math dtype, or None if not accelerated."""
        fig = self.peak_tflops.get(math)  # type: ignore[call-overload]
        return fig.value * 1e12 if fig else None

    @property
    def bandwidth(self) -> float:
        """Peak memory bandwidth in bytes/s."""
        return self.bandwidth_gbps.value * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb.value * 1e9


def _target_files() -> dict[str, str]:
    folder = resources.files("autoplan") / "data" / "targets"
    return {f.name[: -len(".toml")]: f.read_text() for f in folder.iterdir() if f.name.endswith(".toml")}


@cache
def load_catalog() -> dict[str, Target]:
    """Every catalog target by name (the measured `local` target is added by the CPU probe)."""
    catalog: dict[str, Target] = {}
    for stem, text in sorted(_target_files().items()):
        try:
            target = Target.model_validate(tomllib.loads(text))
        except (ValidationError, tomllib.TOMLDecodeError) as exc:
            raise AutoplanError(f"catalog file {stem}.toml is invalid: {exc}") from exc
        if target.name != stem:
            raise AutoplanError(f"catalog file {stem}.toml declares name '{target.name}'")
        catalog[target.name] = target
    return catalog


def _aliases(catalog: dict[str, Target]) -> dict[str, str]:
    table: dict[str, str] = {}
    for target in catalog.values():
        for alias in (target.name, *target.aliases):
            table[alias.lower()] = target.name
    return table


def target_names() -> list[str]:
    return sorted([*load_catalog(), "local"])


def get_target(name: str) -> Target:
    """Resolve a target by name or alias (`h100` -> h100-sxm). `local` measures this machine."""
    key = name.strip().lower()
    if key == "local":
        from autoplan.backends.cpu.local_target import local_target

        return local_target()
    catalog = load_catalog()
    aliases = _aliases(catalog)
    if key in aliases:
        return catalog[aliases[key]]
    raise UnknownNameError("target", name, [*catalog, "local"])


__all__ = ["Figure", "MathDtype", "Target", "get_target", "load_catalog", "target_names"]
