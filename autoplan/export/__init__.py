"""Export a plan to a checkpoint a serving engine loads.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from autoplan.export._prepare import Prepared, needs_calibration, pick_runtime, plan_settings, prepare
from autoplan.plan.schema import Plan
from autoplan.quant import HessianAccumulator
from autoplan.registry import Registry

if TYPE_CHECKING:
    from autoplan.models import LoadedModel
    from autoplan.recover import RecoveredWeights


class Exporter(Protocol):
    """Writes one checkpoint format.

    Attributes:
        name: the format name users pass to ``--format``.
        runtimes: runtimes that load the format, preferred first; a plan is checked against
            its own runtime when listed here, else against the first.
    """

    name: str
    runtimes: tuple[str, ...]

    def write(self, prep: Prepared, out_dir: str | Path) -> Path:
        """Write ``prep`` into ``out_dir`` atomically and return the folder."""
        ...


_EXPORTERS: Registry[Exporter] = Registry("export format")


def register_exporter(exporter: Exporter) -> Exporter:
    """Add an exporter under its ``name``.

    Raises:
        AutoplanError: an exporter with this name is already registered.
    """
    return _EXPORTERS.register(exporter.name, exporter)


def exporter_names() -> list[str]:
    """Every registered format name, sorted."""
    return _EXPORTERS.names()


def get_exporter(fmt: str) -> Exporter:
    """The exporter for a format name.

    Raises:
        UnknownNameError: no such format; lists the registered ones.
    """
    return _EXPORTERS.get(fmt)


def export_plan(plan: Plan, loaded_model: LoadedModel, fmt: str, out_dir: str | Path, *,
                stats: Mapping[str, HessianAccumulator] | None = None,
                calibration: Sequence[Tensor] | None = None,
                allow_model_mismatch: bool = False, recovered: RecoveredWeights | None = None,
                unrecovered: bool = False) -> Path:
    """Export ``plan`` applied to ``loaded_model`` as ``fmt`` into ``out_dir``.

    Args:
        plan: the plan (``autoplan.plan.load_plan``).
        loaded_model: the ``LoadedModel`` the plan was searched on.
        fmt: a registered format name (see ``exporter_names()``).
        out_dir: folder to create; a previous autoplan export there is replaced.
        stats: calibration statistics, when the plan's pruning/GPTQ needs them.
        calibration: the calibration token batches; used to compute missing ``stats`` and
            the static activation scales of NVFP4 layers.
        allow_model_mismatch: export even if the model's content hash is not the plan's.
        recovered: a recovered plan's ``RecoveredWeights`` (``autoplan.recover``).
        unrecovered: write a recovered plan's layers as they were before recovery (the base
            for its LoRA adapter, ``write_lora_adapter``).

    Returns:
        The export folder.

    Raises:
        UserInputError: unknown format, wrong model, a choice the format's runtime cannot
            serve (naming the layers), or weights that do not reproduce the plan's audit.
    """
    exporter = get_exporter(fmt)
    prep = prepare(plan, loaded_model, exporter.name, exporter.runtimes, stats=stats,
                   calibration=calibration, allow_model_mismatch=allow_model_mismatch,
                   recovered=recovered, unrecovered=unrecovered)
    return exporter.write(prep, out_dir)


def _register_builtins() -> None:
    from autoplan.export.compressed_tensors import CompressedTensorsExporter
    from autoplan.export.gguf import GgufExporter
    from autoplan.export.modelopt import ModelOptExporter
    from autoplan.export.onnx import OnnxExporter

    for exporter in (CompressedTensorsExporter(), ModelOptExporter(), OnnxExporter(),
                     GgufExporter()):
        register_exporter(exporter)


_register_builtins()

__all__ = ["Exporter", "Prepared", "export_plan", "exporter_names", "get_exporter",
           "needs_calibration", "pick_runtime", "plan_settings", "prepare", "register_exporter"]
