"""Hardware target catalog: one TOML file per target in autoplan/data/targets/,
validated into frozen pydantic models. Unknown keys are rejected; every figure has a source
that resolves in autoplan/data/references.toml (or is "measured" / "assumed").

Peaks are DENSE tensor/matrix rates (NVIDIA datasheets print 2:4-sparse peaks: hw-facts.md).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoplan.errors import AutoplanError, UnknownNameError
from autoplan.registry import Registry
from autoplan.textenum import TextEnum

MathDtype = Literal["fp32", "bf16", "fp8", "int8", "int4", "fp4"]


class Vendor(TextEnum):
    """Who makes a target's hardware (`cpu-local`: this machine, measured)."""

    __noun__ = "vendor"

    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"
    ARM = "arm"
    CPU_LOCAL = "cpu-local"


class Figure(BaseModel):
    """One number with where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float
    source: str = Field(min_length=1, description="reference key (hw-facts.md §5) or 'measured'")
    uncertain: bool = False
    note: str = ""

    @model_validator(mode="after")
    def _honest(self) -> Figure:
        # hw-facts marks derived arithmetic and assumptions 🟡: they must read as uncertain.
        if self.source == "assumed" and not (self.uncertain and self.note):
            raise ValueError("an 'assumed' figure needs uncertain = true and a note saying why")
        if self.note.startswith("derived:") and not self.uncertain:
            raise ValueError("a derived figure must be marked uncertain = true")
        return self


class CpuNode(BaseModel):
    """How a CPU is sold: sockets per server node, SMT, NUMA domains per socket.

    The target's own figures (memory, bandwidth, peaks, TDP, price) are per SOCKET, one
    memory domain: what one replica pinned to a socket gets. A node of `sockets` sockets
    has that many memory domains; `autoplan/nodes.py` says how a runtime uses them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sockets: int = Field(ge=1, description="sockets per server node")
    threads_per_core: int = Field(ge=1, description="hardware threads per core (SMT)")
    numa_per_socket: int = Field(1, ge=1, description="NUMA domains per socket as configured "
                                 "(sub-NUMA clustering / NPS off: 1)")
    source: str = Field(min_length=1)
    uncertain: bool = False
    note: str = ""

    @model_validator(mode="after")
    def _honest(self) -> CpuNode:
        if self.source == "assumed" and not (self.uncertain and self.note):
            raise ValueError("an 'assumed' node needs uncertain = true and a note saying why")
        return self


MIB = 2**20  # nvidia-smi and rocm-smi (divided by it) report device memory in MiB


class Target(BaseModel):
    """One piece of hardware as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    aliases: tuple[str, ...] = ()
    description: str
    vendor: Vendor
    kind: Literal["gpu", "cpu"]
    family: str = Field(description="hardware family; efficiency constants are global per family")
    memory_gb: Figure = Field(description="nominal memory as marketed, decimal GB (GPUs: per "
                              "device; CPUs: typical node memory per socket)")
    visible_memory_mib: Figure | None = Field(
        default=None, description="GPUs: device memory the runtime sees, MiB, as nvidia-smi / "
        "rocm-smi report it (a dated public reading); absent where none is cited")
    bandwidth_gbps: Figure
    peak_tflops: dict[MathDtype, Figure] = Field(description="dense peaks per math dtype")
    sparse24: dict[MathDtype, Figure] = Field(
        default_factory=dict, description="2:4 speedup multiplier of the peak, per math dtype"
    )
    tdp_w: Figure
    price_per_hour: Figure = Field(description="default $/hour for one device (or one socket)")
    cores: int | None = None
    machine: str | None = Field(
        default=None, description="`local`: the CPU its figures were measured on (model, cores, "
        "threads), so a plan or table measured there is not taken for another machine's")
    l2_mb: Figure | None = None
    llc_mb: Figure | None = Field(
        default=None, description="last-level cache: CPU L3, AMD Infinity Cache"
    )
    clock_ghz: Figure | None = Field(
        default=None, description="clock the CPU peaks assume (peaks scale with it)"
    )
    features: tuple[str, ...] = ()
    device_match: tuple[str, ...] = Field(
        default=(), description="regexes on the normalized driver name; probes match by them"
    )
    measured: bool = False
    node: CpuNode | None = Field(default=None, description="CPUs: sockets, SMT and NUMA of a "
                                 "server node (the figures above are per socket)")

    @model_validator(mode="after")
    def _node_for_cpus(self) -> Target:
        if self.node is not None and self.kind != "cpu":
            raise ValueError("a [node] table (sockets, SMT, NUMA) is for CPU targets")
        if self.visible_memory_mib is not None and self.kind != "gpu":
            raise ValueError("visible_memory_mib is a GPU's runtime-visible device memory")
        return self

    @field_validator("name")
    @classmethod
    def _lowercase(cls, v: str) -> str:
        if v != v.lower():
            raise ValueError("target names are lowercase")
        return v

    @field_validator("device_match")
    @classmethod
    def _regexes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"device_match '{pattern}' is not a regex: {exc}") from exc
        return v

    @property
    def platform(self) -> str:
        """Where runtimes run: "nvidia-gpu", "amd-gpu" or "cpu"."""
        return f"{self.vendor}-gpu" if self.kind == "gpu" else "cpu"

    def sparse_multiplier(self, math: str) -> float:
        """2:4 speedup of the peak for a math dtype (1.0 where 2:4 is not accelerated)."""
        fig = self.sparse24.get(math)  # type: ignore[call-overload]
        return fig.value if fig else 1.0

    def figures(self) -> dict[str, Figure]:
        """Every figure by dotted path (`peak_tflops.bf16`), for audits and tables."""
        out: dict[str, Figure] = {}
        for field_name in type(self).model_fields:
            value = getattr(self, field_name)
            if isinstance(value, Figure):
                out[field_name] = value
            elif isinstance(value, dict):
                out.update({f"{field_name}.{k}": f for k, f in value.items()})
        return out

    def uncertain_figures(self) -> list[str]:
        """Dotted paths of figures marked uncertain."""
        return [path for path, fig in self.figures().items() if fig.uncertain]

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
        """Device (or typical node) memory in bytes: what fits, batch and KV capacity use.

        The runtime-visible total where the catalog cites one (an "80 GB" H100 reports
        81,559 MiB = 85.5e9 B, 7 % more than 80e9), else the nominal `memory_gb` x 1e9.
        """
        if self.visible_memory_mib is not None:
            return self.visible_memory_mib.value * MIB
        return self.memory_gb.value * 1e9


def _target_files() -> dict[str, str]:
    folder = resources.files("autoplan") / "data" / "targets"
    return {f.name[: -len(".toml")]: f.read_text() for f in folder.iterdir() if f.name.endswith(".toml")}


# Sources that are not literature keys: this machine's measurement, or a stated assumption.
SPECIAL_SOURCES = ("measured", "assumed")


@cache
def load_references() -> dict[str, str]:
    """Reference key -> location (autoplan/data/references.toml)."""
    text = (resources.files("autoplan") / "data" / "references.toml").read_text()
    return dict(tomllib.loads(text)["refs"])


def check_source(source: str, where: str) -> None:
    """Raise if `source` is neither a reference key nor a special source.

    Args:
        source: the figure's or rule's source key.
        where: what names the place in the error message (a file and field).

    Raises:
        AutoplanError: the key does not resolve.
    """
    if source not in SPECIAL_SOURCES and source not in load_references():
        raise AutoplanError(
            f"{where}: source '{source}' is not in autoplan/data/references.toml; add it there"
        )


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
        for path, fig in target.figures().items():
            check_source(fig.source, f"catalog file {stem}.toml, {path}")
        if target.node is not None:
            check_source(target.node.source, f"catalog file {stem}.toml, node")
        catalog[target.name] = target
    _check_aliases(catalog)
    return catalog


def _check_aliases(catalog: dict[str, Target]) -> None:
    seen: dict[str, str] = {}
    for target in catalog.values():
        for alias in (target.name, *target.aliases):
            key = alias.lower()
            if seen.get(key, target.name) != target.name or key == "local":
                raise AutoplanError(f"target alias '{alias}' is claimed twice; rename one")
            seen[key] = target.name


def _normalize_device_name(name: str) -> str:
    # Drivers report "NVIDIA A100-SXM4-80GB" or "AMD Instinct MI300X": drop the vendor
    # word and separators so one regex per target covers the spellings.
    text = re.sub(r"[-_/]+", " ", name.lower())
    text = re.sub(r"\b(nvidia|amd|instinct)\b", " ", text)
    return " ".join(text.split())


def match_device(name: str) -> Target | None:
    """The catalog target whose `device_match` regex fits a driver-reported name.

    Args:
        name: the device name as pynvml/amdsmi report it.

    Returns:
        The best match (the longest matching regex wins, so "h100 pcie" beats "h100"),
        or None when no catalog entry describes that device.
    """
    normalized = _normalize_device_name(name)
    best: tuple[int, Target] | None = None
    for target in load_catalog().values():
        for pattern in target.device_match:
            if re.search(pattern, normalized) and (best is None or len(pattern) > best[0]):
                best = (len(pattern), target)
    return best[1] if best else None


def _aliases(catalog: dict[str, Target]) -> dict[str, str]:
    table: dict[str, str] = {}
    for target in catalog.values():
        for alias in (target.name, *target.aliases):
            table[alias.lower()] = target.name
    return table


# Targets a backend measures on this machine (the CPU backend: `local`), name -> factory.
# Registered by autoplan.backends.registry.load_backends; the catalog imports no backend.
_MEASURED: Registry[Callable[[], Target]] = Registry("measured target", "rename one")


def register_measured_target(name: str, factory: Callable[[], Target]) -> None:
    """Add a target a backend measures (called when the backend is loaded; idempotent).

    Raises:
        AutoplanError: the name is a catalog name or alias, or another factory holds it.
    """
    if _MEASURED.find(name) is factory:
        return  # the same backend loaded again
    if Registry.key(name) in _aliases(load_catalog()):
        raise AutoplanError(f"measured target '{name}' is a catalog target too: rename one")
    _MEASURED.register(name, factory)


def measured_target_names() -> list[str]:
    """The names of the registered measured targets, sorted."""
    return _MEASURED.names()


def target_names() -> list[str]:
    """Every target name users can pass: the catalog and the measured targets."""
    return sorted([*load_catalog(), *_MEASURED.names()])


def get_target(name: str) -> Target:
    """Resolve a target by name or alias (`h100` -> h100-sxm); a measured target (`local`)
    is measured by its backend on first use, then cached."""
    key = name.strip().lower()
    if key in _MEASURED:
        return _MEASURED.get(key)()
    catalog = load_catalog()
    aliases = _aliases(catalog)
    if key in aliases:
        return catalog[aliases[key]]
    if key == "local":
        raise AutoplanError("target 'local' is measured by the CPU backend, which is not loaded: "
                            "resolve it with autoplan.backends.registry.resolve_target")
    raise UnknownNameError("target", name, target_names())


__all__ = [
    "CpuNode",
    "Figure",
    "MathDtype",
    "SPECIAL_SOURCES",
    "Target",
    "Vendor",
    "check_source",
    "get_target",
    "load_catalog",
    "load_references",
    "match_device",
    "measured_target_names",
    "register_measured_target",
    "target_names",
]
