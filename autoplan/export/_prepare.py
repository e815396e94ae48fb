"""Everything every exporter needs before it writes a byte: checks, then the plan's weights.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from autoplan.compress import (CompressionSettings, audit_digests, collect_stats, compress_linear,
                               observe_inputs, recompress_linear)
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.export.kv import kv_scales, static_kv
from autoplan.formats import Choice, format_spec, registered_formats
from autoplan.models.graph import get_linear
from autoplan.numerics import signature
from autoplan.plan.schema import Plan
from autoplan.prune import PruneScore
from autoplan.quant import HessianAccumulator, SimulatedLinear
from autoplan.recover.weights import RecoveredWeights
from autoplan.runtimes import get_runtime, listing, refused_layers
from autoplan.backends.registry import resolve_target as get_target
from autoplan.targets import Target

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

UNQUANTIZED = frozenset(s.precision for s in registered_formats() if not s.quantized)
_SHOWN = 4  # offending layers named in a refusal before "and N more"


@dataclass
class Prepared:
    """A plan checked against a model, with the plan's compressed layers recomputed.

    Attributes:
        plan: the plan.
        loaded: the LoadedModel (model, tokenizer, spec, content_hash, model_id).
        target: the plan's hardware target.
        runtime: the runtime the checks were made for.
        choices: layer -> Choice, every decided layer.
        sims: layer -> SimulatedLinear with the plan's exact weights, codes and scales.
        input_global_scales: layer -> the static input parameter its format's
            ``input_calibration`` makes from the calibration set (NVFP4: FP32 [1] global
            scale); only layers whose format has one.
    """

    plan: Plan
    loaded: LoadedModel
    target: Target
    runtime: str
    choices: dict[str, Choice]
    sims: dict[str, SimulatedLinear]
    input_global_scales: dict[str, Tensor] = field(default_factory=dict)
    # block -> (K scale, V scale) of a KV cache with static scales (export/kv.py), else {}
    kv_scales: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)

    def quantized(self) -> dict[str, SimulatedLinear]:
        """The layers stored in a low-precision format (not fp32/bf16/fp16)."""
        return {n: s for n, s in self.sims.items() if s.choice.precision not in UNQUANTIZED}


def _listing(names: Sequence[str]) -> str:
    return listing(list(names), _SHOWN)


def parse_decisions(plan: Plan) -> dict[str, Choice]:
    """The plan's decisions as Choices (the plan stores their text form)."""
    return {name: Choice.parse(text) for name, text in plan.decisions.items()}


def check_model(plan: Plan, loaded: LoadedModel, allow_mismatch: bool) -> None:
    """Refuse a model whose weights are not the ones the plan was searched on."""
    if loaded.content_hash != plan.model.content_hash and not allow_mismatch:
        raise UserInputError(
            f"model '{loaded.model_id}' has content hash {loaded.content_hash[:12]} but the plan "
            f"was made for {plan.model.id} ({plan.model.content_hash[:12]}): pass the plan's "
            "model, or --allow-model-mismatch to export anyway")


def pick_runtime(plan: Plan, runtimes: Sequence[str]) -> str:
    """The plan's runtime when the format serves it, else the format's first runtime."""
    return plan.runtime.name if plan.runtime.name in runtimes else runtimes[0]


def check_runtime(fmt: str, target: Target, runtime: str, choices: Mapping[str, Choice]) -> None:
    """Refuse layers whose choice ``runtime`` cannot serve on ``target``, naming them.

    The answer is ``autoplan.runtimes.supports`` (the runtime matrix) alone, the one search
    uses, so export and apply accept exactly the plans search can make.
    """
    refused = refused_layers(target, runtime, choices, _SHOWN)
    if refused:
        raise UnsupportedFormatError(
            f"--format {fmt} is served by {runtime}, which cannot serve {refused}; re-plan "
            f"with --runtime {runtime} or pick another --format")


def check_fused_groups(loaded: LoadedModel, choices: Mapping[str, Choice]) -> None:
    """Refuse plans whose fused layers (one GEMM in the runtime) have different choices."""
    groups: dict[str, set[Choice]] = {}
    members: dict[str, list[str]] = {}
    for layer in loaded.spec.layers:
        if layer.name in choices:
            groups.setdefault(layer.fuse_group, set()).add(choices[layer.name])
            members.setdefault(layer.fuse_group, []).append(layer.name)
    for group, found in groups.items():
        if len(found) > 1:
            raise UnsupportedFormatError(
                f"layers {_listing(members[group])} run as one fused GEMM but are planned "
                f"{' / '.join(sorted(map(str, found)))}: give them one choice (re-run search)")


def input_amax(model: torch.nn.Module, layers: Iterable[str],
               batches: Iterable[Tensor]) -> dict[str, Tensor]:
    """Largest |input| each named linear sees over the calibration batches (FP32 [1])."""
    amax: dict[str, Tensor] = {}

    def observe(name: str, x: Tensor) -> None:
        seen = x.detach().abs().amax().float().reshape(1)
        amax[name] = torch.maximum(amax[name], seen) if name in amax else seen

    observe_inputs(model, layers, batches, observe)
    return amax


def _verify_audit(plan: Plan, sims: Mapping[str, SimulatedLinear],
                  expected: Mapping[str, dict[str, str]] | None = None) -> None:
    expected = plan.audit.tensors if expected is None else expected
    if not expected:
        return
    got = audit_digests({n: s for n, s in sims.items() if n in expected})
    bad = sorted(n for n in expected if got.get(n) != expected[n])
    if bad:
        raise UserInputError(
            f"recomputed weights of {len(bad)} layer(s) differ from the plan's audit "
            f"({_listing(bad)}): {_mismatch_cause(plan)}")


def _mismatch_cause(plan: Plan) -> str:
    """Why recomputed weights can differ, most specific first: the solvers' numerics (torch
    build, CPU kernels) when they differ from the search's, else calibration or model."""
    recorded = plan.audit.solver_numerics
    if recorded is not None and recorded != signature():
        return (f"the plan's SparseGPT/GPTQ weights were solved with {recorded} and this "
                f"machine has {signature()}, which round differently; re-run the search "
                "here, or export where it ran")
    return (f"the calibration data ({plan.audit.calibration_source}) or the model differ "
            "from the search's; export with the same calibration set")


def apply_recovered(plan: Plan, loaded: LoadedModel, sims: dict[str, SimulatedLinear],
                    recovered: RecoveredWeights,
                    stats: Mapping[str, HessianAccumulator] | None) -> dict[str, SimulatedLinear]:
    """The plan's layers with their recovered weights, each layer's format re-applied under
    the mask recomputed from the original (a weight outside its mask is refused)."""
    settings = plan_settings(plan)
    out = dict(sims)
    for name, w in recovered.weights.items():
        sim = sims.get(name)
        if sim is None or tuple(w.shape) != (sim.out_features, sim.in_features):
            raise UserInputError(f"recovered weights hold '{name}' {tuple(w.shape)}, which "
                                 "the plan does not compress in that shape: pass the plan's "
                                 "own recovered weights")
        if bool((w[~sim.mask] != 0).any()):
            raise UserInputError(f"recovered weight of {name} is non-zero where its mask "
                                 "prunes: the file does not belong to this plan's masks")
        out[name] = recompress_linear(get_linear(loaded.model, name), sim.choice, sim.mask, w,
                                      stats.get(name) if stats else None, settings)
    return out


def plan_settings(plan: Plan) -> CompressionSettings:
    """The plan's compression settings, its solvers pinned to the thread count it records."""
    return CompressionSettings(plan.compression.prune_score, plan.compression.quant_method,
                               solver_threads=plan.audit.solver_threads)


def _needs_stats(plan: Plan, choices: Mapping[str, Choice]) -> bool:
    settings = plan_settings(plan)
    sparse = any(c.sparsity.kind != "dense" for c in choices.values())
    return settings.needs_hessian or (sparse and settings.prune_score is not PruneScore.MAGNITUDE)


def _calibrated_inputs(choices: Mapping[str, Choice]) -> dict[str, Any]:
    """layer -> its format's ``input_calibration``, for the formats whose checkpoint stores
    a static input parameter (NVFP4's input global scale)."""
    found = {n: format_spec(c.precision).input_calibration for n, c in choices.items()}
    return {n: fn for n, fn in found.items() if fn is not None}


def needs_calibration(plan: Plan) -> bool:
    """True when exporting ``plan`` needs its calibration tokens (statistics, or a format
    whose inputs are calibrated: NVFP4)."""
    choices = parse_decisions(plan)
    return _needs_stats(plan, choices) or bool(_calibrated_inputs(choices)) \
        or static_kv(plan) is not None


def prepare(plan: Plan, loaded: LoadedModel, fmt: str, runtimes: Sequence[str], *,
            stats: Mapping[str, HessianAccumulator] | None = None,
            calibration: Sequence[Tensor] | None = None,
            allow_model_mismatch: bool = False,
            recovered: RecoveredWeights | None = None, unrecovered: bool = False) -> Prepared:
    """Check the plan against the model and runtime, then recompute its compressed layers.

    Args:
        plan: the plan to export.
        loaded: the LoadedModel the plan was searched on.
        fmt: format name (for messages).
        runtimes: runtimes that load this format, preferred first.
        stats: calibration statistics (``collect_stats``); computed from ``calibration``
            when missing and the plan's settings need them.
        calibration: token batches [batch, seq] of the plan's calibration set; also used
            for NVFP4 static activation global scales.
        allow_model_mismatch: export even if the model's content hash differs.
        recovered: a recovered plan's weights (``autoplan.recover.read_recovered``).
        unrecovered: a recovered plan's layers before recovery (the base an engine that
            serves the LoRA adapter loads), checked against ``recovery.unrecovered_tensors``.

    Raises:
        UserInputError: wrong model, unservable or unfused choices, missing calibration,
            or weights that do not reproduce the plan's audit.
    """
    if isinstance(calibration, Tensor):  # a [n, seq] tensor iterates as 1-D rows: not batches
        raise TypeError("calibration takes a sequence of [batch, seq] token batches, e.g. "
                        "list(tokens.split(2)), not one tensor")
    check_model(plan, loaded, allow_model_mismatch)
    target = get_target(plan.target.name)
    runtime = pick_runtime(plan, runtimes)
    choices = parse_decisions(plan)
    check_runtime(fmt, target, runtime, choices)
    if get_runtime(runtime).fused_projections:
        check_fused_groups(loaded, choices)
    settings = plan_settings(plan)
    needs_stats = _needs_stats(plan, choices)
    if needs_stats and stats is None:
        if calibration is None:
            raise UserInputError(
                f"the plan's {settings.prune_score}/{settings.quant_method} weights need "
                f"calibration statistics: pass the calibration set ({plan.audit.calibration_source})")
        stats = collect_stats(loaded.model, choices, calibration, full=settings.needs_hessian)
    # compress_linear leaves the original layer untouched, so no model copy is needed here.
    sims = {name: compress_linear(get_linear(loaded.model, name), choice,
                                  stats.get(name) if needs_stats and stats else None, settings)
            for name, choice in choices.items()}
    expected = None
    if plan.recovery is not None and unrecovered:
        expected = plan.recovery.unrecovered_tensors
    elif plan.recovery is not None:
        if recovered is None:
            raise UserInputError(
                f"this plan's layers were recovered: keep {plan.recovery.weights_file} beside "
                "the plan or pass --recovered FILE")
        _verify_audit(plan, sims, plan.recovery.unrecovered_tensors)  # masks as searched
        sims = apply_recovered(plan, loaded, sims, recovered,
                               stats if needs_stats else None)
    elif unrecovered:
        raise UserInputError("this plan was not recovered: export it without --lora-adapter")
    _verify_audit(plan, sims, expected)
    calibrated = _calibrated_inputs(choices)
    scales: dict[str, Tensor] = {}
    if calibrated:
        if calibration is None:
            kinds = "/".join(sorted({choices[n].precision.value.upper() for n in calibrated}))
            raise UserInputError(
                f"{kinds} layers ({_listing(sorted(calibrated))}) need a static activation "
                "scale from calibration data: pass the calibration set")
        scales = {n: calibrated[n](a) for n, a in
                  input_amax(loaded.model, list(calibrated), calibration).items()}
    kv = kv_scales(plan, loaded.model, calibration)
    return Prepared(plan, loaded, target, runtime, choices, sims, scales, kv)


__all__ = ["Prepared", "UNQUANTIZED", "apply_recovered", "check_fused_groups", "check_model",
           "check_runtime", "input_amax", "needs_calibration", "parse_decisions", "pick_runtime",
           "prepare"]
