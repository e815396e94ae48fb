"""Atomic export folders and the audit written next to every checkpoint.

An export is written into a hidden sibling folder and renamed into place only when it is
complete, so a crash or a refusal never leaves a half-written checkpoint where a server
could load it. Beside the weights go the plan (``autoplan_plan.json``) and the audit
(``autoplan_export.json``): format, runtime, per-layer choices and the sha256 of every
tensor in every safetensors file, as stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors import safe_open

from autoplan import __version__
from autoplan.atomic import json_text
from autoplan.compress import tensor_digest
from autoplan.plan.schema import Plan

PLAN_FILE = "autoplan_plan.json"
AUDIT_FILE = "autoplan_export.json"
AUDIT_VERSION = 1


def _dump(path: Path, data: Any) -> None:
    path.write_text(json_text(data))  # inside the temp folder: the folder rename is atomic


def is_export(folder: Path) -> bool:
    """Whether a folder is an autoplan export (holds the audit): what ``atomic_dir`` may
    replace."""
    return (folder / AUDIT_FILE).is_file()


def tensor_digests(folder: Path) -> dict[str, dict[str, str]]:
    """file -> {tensor name -> sha256 of dtype, shape and bytes} for every safetensors file."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            out[path.name] = {key: tensor_digest(fh.get_tensor(key)) for key in sorted(fh.keys())}
    return out


def write_sidecars(folder: Path, plan: Plan, fmt: str, runtime: str,
                   layers: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
                   artifact: Path | None = None) -> None:
    """Write the plan and the audit into a finished checkpoint folder.

    Args:
        folder: the (temporary) export folder, weights already written.
        plan: the exported plan.
        fmt: format name.
        runtime: the runtime the checkpoint is for.
        layers: layer -> description of how it is stored (JSON-serializable).
        extra: more audit fields (e.g. what was verified).
        artifact: where the artifact will lie (the folder, or the GGUF file): the plan's
            deploy command is written beside it with that path (export/kv.py).
    """
    _dump(folder / PLAN_FILE, plan.model_dump(mode="json"))
    _dump(folder / AUDIT_FILE, {
        "schema_version": AUDIT_VERSION,
        "autoplan_version": __version__,
        "format": fmt,
        "runtime": runtime,
        "model": {"id": plan.model.id, "content_hash": plan.model.content_hash},
        "plan_calibration_hash": plan.audit.calibration_hash,
        "layers": dict(sorted(layers.items())),
        "tensors": tensor_digests(folder),
        **(extra or {}),
    })
    if artifact is not None:
        from autoplan.export.kv import write_deploy

        write_deploy(folder, plan, artifact, runtime)


def engine_names(folder: Path, model_type: str) -> None:
    """Rename a written checkpoint's routed-expert tensors (and the module names its
    quantization config targets) to the names its architecture's checkpoints use, which
    the engines load by (Mixtral: `block_sparse_moe.experts.{e}.w1/w3/w2`); every other
    architecture keeps transformers' names."""
    import json

    from safetensors.torch import load_file, save_file

    from autoplan.models.moe import checkpoint_key

    if model_type != "mixtral":
        return
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata()
        tensors = load_file(str(path))
        save_file({checkpoint_key(k, model_type): v for k, v in tensors.items()}, str(path),
                  metadata=metadata)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        doc = json.loads(index.read_text())
        doc["weight_map"] = {checkpoint_key(k, model_type): v
                             for k, v in doc["weight_map"].items()}
        index.write_text(json.dumps(doc, indent=2))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    quant = config.get("quantization_config") or {}

    def module(name: str) -> str:
        return name if name.startswith("re:") else checkpoint_key(f"{name}.x", model_type)[:-2]

    for group in (quant.get("config_groups") or {}).values():
        group["targets"] = [module(t) for t in group.get("targets", [])]
    if "ignore" in quant:
        quant["ignore"] = [module(t) for t in quant["ignore"]]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))


__all__ = ["AUDIT_FILE", "PLAN_FILE", "engine_names", "is_export", "tensor_digests",
           "write_sidecars"]
