"""SearchSpace: which choices each decision unit may take, for one target x runtime.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources

from pydantic import BaseModel, ConfigDict, ValidationError

from autoplan.cost.moe import expert_takes
from autoplan.errors import AutoplanError, UnsupportedFormatError
from autoplan.formats import Choice
from autoplan.modelspec import LinearLayer, ModelSpec
from autoplan.runtimes import get_runtime, supports
from autoplan.targets import Target


class SpaceFile(BaseModel):
    """One search_spaces/<platform>.toml file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    platform: str
    baseline: str
    candidates: tuple[str, ...]
    protect_roles: tuple[str, ...] = ("lm_head",)
    protect_first_block: bool = False
    protect_last_block: bool = False
    roles: dict[str, tuple[str, ...]] = {}


def load_space_file(platform: str) -> SpaceFile:
    """Read and validate the space file of a platform (nvidia-gpu, amd-gpu, cpu)."""
    path = resources.files("autoplan.search_spaces") / f"{platform}.toml"
    if not path.is_file():
        raise AutoplanError(f"no search space file for platform '{platform}'")
    try:
        return SpaceFile.model_validate(tomllib.loads(path.read_text()))
    except (ValidationError, tomllib.TOMLDecodeError) as exc:
        raise AutoplanError(f"search space {platform}.toml is invalid: {exc}") from exc


@dataclass(frozen=True)
class DecisionUnit:
    """Layers sharing one choice, and the choices allowed for them (baseline first)."""

    name: str
    layers: tuple[LinearLayer, ...]
    choices: tuple[Choice, ...]

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


@dataclass(frozen=True)
class SearchSpace:
    """Decision units to search, protected layers, and why candidates were dropped."""

    target: str
    runtime: str
    baseline: Choice
    units: tuple[DecisionUnit, ...]
    protected: tuple[LinearLayer, ...]
    dropped: dict[str, str] = field(default_factory=dict)  # choice -> reason

    def decisions(self, picks: dict[str, Choice]) -> dict[str, Choice]:
        """Expand unit picks into per-layer decisions (protected layers get the baseline)."""
        out = {layer.name: self.baseline for layer in self.protected}
        for unit in self.units:
            choice = picks.get(unit.name, self.baseline)
            for layer in unit.layers:
                out[layer.name] = choice
        return out

    def uniform(self, choice: Choice) -> dict[str, Choice]:
        """Per-layer decisions applying `choice` to every searchable unit that allows it."""
        return self.decisions({u.name: choice for u in self.units if choice in u.choices})

    @property
    def all_choices(self) -> tuple[Choice, ...]:
        seen: dict[Choice, None] = {}
        for unit in self.units:
            seen.update(dict.fromkeys(unit.choices))
        return tuple(seen)


# parts of a model the runtime matrix has rules about of their own (engines' fused-MoE kernels)
_SCOPED = ("routed_experts",)


def _fits(choice: Choice, layer: LinearLayer) -> bool:
    """Whether the pattern tiles the layer (2:4 needs in % 4 == 0, blocks need both dims) and
    the format's scale groups / blocks fit it (``PrecisionInfo.shape_problem``)."""
    sp = choice.sparsity
    if sp.kind == "nm":
        return layer.in_features % sp.m == 0
    if sp.kind == "block":
        return layer.in_features % sp.block == 0 and layer.out_features % sp.block == 0
    return not choice.precision.info.shape_problem(layer.out_features, layer.in_features)


def build_space(
    spec: ModelSpec,
    target: Target,
    runtime: str,
    *,
    protect_first_block: bool | None = None,
    protect_last_block: bool | None = None,
    candidates: list[Choice] | None = None,
) -> SearchSpace:
    """The search space of a model on a target x runtime.

    Raises:
        UnsupportedFormatError: the runtime accelerates nothing but the baseline here.
    """
    rt = get_runtime(runtime)
    if target.platform not in rt.platforms:
        raise UnsupportedFormatError(
            f"{rt.name} does not run on {target.platform} targets like {target.name} (it runs "
            f"on {', '.join(rt.platforms)}); pick another --runtime"
        )
    sf = load_space_file(target.platform)
    baseline = Choice.parse(sf.baseline)
    pool = candidates or [Choice.parse(c) for c in sf.candidates]
    dropped: dict[str, str] = {}
    allowed: list[Choice] = []
    for choice in pool:
        verdict = supports(target, runtime, choice)
        if verdict.ok:
            allowed.append(choice)
        else:
            dropped[str(choice)] = verdict.reason
    if baseline not in allowed:
        allowed.insert(0, baseline)
    first = sf.protect_first_block if protect_first_block is None else protect_first_block
    last = sf.protect_last_block if protect_last_block is None else protect_last_block
    protected_blocks = ({0} if first else set()) | ({spec.n_layers - 1} if last else set())

    groups: dict[str, list[LinearLayer]] = {}
    protected: list[LinearLayer] = []
    for layer in spec.layers:
        if layer.role in sf.protect_roles or layer.block in protected_blocks:
            protected.append(layer)
        else:  # one unit per GEMM the runtime runs
            # a runtime that stores a block's experts stacked per projection gives each
            # stacked tensor (llama.cpp's ffn_gate_exps ...) one type: one unit per tensor
            groups.setdefault(layer.fuse_group if rt.fused_projections else layer.stored_as,
                              []).append(layer)
    units = []
    for name, layers in groups.items():
        role_pool = sf.roles.get(layers[0].role)
        part = layers[0].part
        ok = [c for c in allowed if all(_fits(c, la) for la in layers)
              and (role_pool is None or str(c) in role_pool or c == baseline)
              and (layers[0].expert < 0 or expert_takes(c))
              and (c == baseline or part not in _SCOPED or supports(target, runtime, c, part).ok)]
        ok.sort(key=lambda c: c != baseline)  # baseline first: index 0 is "no change"
        units.append(DecisionUnit(name, tuple(layers), tuple(ok)))
    if not any(len(u.choices) > 1 for u in units):
        reasons = "; ".join(f"{c}: {r}" for c, r in list(dropped.items())[:3])
        raise UnsupportedFormatError(
            f"{runtime} accelerates no compressed format on {target.name} for this model "
            f"({reasons}); pick another --runtime or --target"
        )
    return SearchSpace(target.name, runtime, baseline, tuple(units), tuple(protected), dropped)


__all__ = ["DecisionUnit", "SearchSpace", "SpaceFile", "build_space", "load_space_file"]
