"""The plan's KV cache in an export: its static K/V scales recalibrated and checked against
the plan's digests, or refused; and the deploy files written beside the artifact.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autoplan.backends.registry import resolve_target as get_target
from autoplan.compress import tensor_digest
from autoplan.deploy import Deploy, deploy_for
from autoplan.errors import UnsupportedFormatError, UserInputError
from autoplan.formats.kv import KvFormat, kv_spec
from autoplan.plan.schema import Plan

DEPLOY_JSON = "autoplan_deploy.json"
DEPLOY_SH = "autoplan_deploy.sh"


def scale_digest(k: Tensor, v: Tensor) -> str:
    """sha256 of one block's K and V scales as the plan's ``kv_cache.scale_digests`` holds it."""
    return tensor_digest(torch.cat([k.float().reshape(-1), v.float().reshape(-1)]))


def static_kv(plan: Plan) -> KvFormat | None:
    """The plan's cache format when it has static scales to export, else None."""
    kv = plan.kv_cache
    if kv is None or kv.format == kv.default or kv.scales != "checkpoint":
        return None
    fmt = KvFormat.parse(kv.format)
    return fmt if kv_spec(fmt).static else None


def kv_scales(plan: Plan, model: torch.nn.Module, calibration: Sequence[Tensor] | None
              ) -> dict[int, tuple[Tensor, Tensor]]:
    """block -> (K scale, V scale) of the plan's cache, recalibrated and checked ({} when
    its cache needs no exported scales).

    Raises:
        UserInputError: no calibration set, a plan without calibrated scales, or scales
            that differ from the plan's.
    """
    fmt = static_kv(plan)
    if fmt is None:
        return {}
    digests = plan.kv_cache.scale_digests  # type: ignore[union-attr]
    if not digests:
        raise UserInputError(f"the plan's {fmt.value} KV cache has no calibrated scales "
                             "(no kv_cache.scale_digests): re-run the search; an export never "
                             "writes placeholder scales")
    if calibration is None:
        raise UserInputError(f"the plan's {fmt.value} KV cache needs its static K/V scales "
                             f"from the calibration set ({plan.audit.calibration_source}): "
                             "pass it (--calibration)")
    from autoplan.quant.kv_cache import calibrate_kv

    out = {}
    for i, amax in calibrate_kv(model, calibration).items():
        k, v = amax.scales(fmt)
        if digests.get(str(i)) != scale_digest(k, v):
            raise UserInputError(f"the KV scales recomputed for block {i} differ from the "
                                 "plan's: export with the plan's model and calibration set")
        out[i] = (k.float(), v.float())
    return out


def kv_scheme(plan: Plan, exporter: str) -> Any:
    """The exporter's name for the plan's cache (None: the engine's own cache, or one the
    engine sets from its command line alone).

    Raises:
        UnsupportedFormatError: the cache needs exported scales the exporter cannot hold.
    """
    kv = plan.kv_cache
    if kv is None or kv.format == kv.default:
        return None
    spec = kv_spec(kv.format)
    named = spec.naming(exporter)
    from autoplan.formats.registry import Refused

    if isinstance(named, Refused):
        if static_kv(plan) is not None:
            raise UnsupportedFormatError(f"--format {exporter} cannot store the plan's "
                                         f"{kv.format} KV cache scales: {named.reason}")
        return None  # e.g. fp8_e5m2 for vLLM: --kv-cache-dtype alone
    return named or None


def deploy_of(plan: Plan, runtime: str) -> Deploy | None:
    """The serving command of the plan's artifact on `runtime`: the plan's own, or, for an
    export to another engine's format (a vLLM plan exported for TensorRT-LLM), that engine's
    command at the batch, context and KV cache the plan assumed; None where the plan has
    none or that engine serves no such cache."""
    if plan.deploy is None:
        return None
    d = Deploy.from_json(plan.deploy.model_dump(mode="json"))
    if d.runtime == runtime:
        return d
    w, kv = plan.workload, plan.kv_cache
    context = int(d.settings.get("max_model_len", w.input_len + w.output_len))
    try:  # deploy_for serves input_len + output_len tokens: the plan's command's context
        return deploy_for(runtime, get_target(plan.target.name),
                          kv=KvFormat.parse(str(d.settings.get("kv_cache", kv and kv.format))),
                          batch=int(d.settings.get("batch", w.batch)), input_len=context,
                          output_len=0,
                          kv_bytes_per_sequence=kv.bytes_per_sequence if kv else 0.0)
    except (ValueError, UserInputError):  # a cache that engine does not serve
        return None


def write_deploy(folder: Path, plan: Plan, artifact: Path, runtime: str) -> None:
    """The serving command of the artifact on `runtime` (deploy_of) beside it: JSON and a
    shell script (with the artifact's path and any options file the command reads)."""
    from autoplan.atomic import json_text

    d = deploy_of(plan, runtime)
    if d is None:
        return
    d = d.with_model(str(artifact))
    (folder / DEPLOY_JSON).write_text(json_text(d.to_json()))
    for name, text in d.files.items():
        (folder / name).write_text(text)
    if d.command:
        lines = ["#!/bin/sh", f"# {d.runtime}: batch {d.settings.get('batch')}, "
                 f"context {d.settings.get('max_model_len')} (what the plan assumed)",
                 'cd "$(dirname "$0")"' if d.files else "", "exec " + d.shell()]
        (folder / DEPLOY_SH).write_text("\n".join(x for x in lines if x) + "\n")


__all__ = ["DEPLOY_JSON", "DEPLOY_SH", "deploy_of", "kv_scales", "kv_scheme", "scale_digest",
           "static_kv", "write_deploy"]
