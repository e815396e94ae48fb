"""The recovered-weights file a recovered plan points to: safetensors, beside the plan.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from autoplan.atomic import write_bytes_atomic
from autoplan.errors import UserInputError

SUFFIX = ".recovered.safetensors"
KIND = "autoplan-recovered-weights-v1"


@dataclass(frozen=True)
class RecoveredWeights:
    """Recovered layers: weights (and LoRA adapters), with the file's sha256."""

    weights: dict[str, Tensor] = field(repr=False)
    adapters: dict[str, dict[str, Tensor]] = field(default_factory=dict, repr=False)
    scaling: float | None = None
    sha256: str = ""


def weights_path_for(plan_path: str | Path) -> Path:
    """``dir/plan.json`` -> ``dir/plan.recovered.safetensors``."""
    p = Path(plan_path)
    return p.with_name(p.stem + SUFFIX)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_recovered(path: str | Path, weights: dict[str, Tensor],
                    adapters: dict[str, dict[str, Tensor]] | None = None,
                    scaling: float | None = None, extra: dict[str, str] | None = None) -> str:
    """Write the file atomically (``extra``: more metadata strings); return its sha256."""
    tensors = {f"{n}.weight": w.detach().float().contiguous() for n, w in weights.items()}
    for n, ad in (adapters or {}).items():
        tensors.update({f"{n}.{k}": v.detach().float().contiguous() for k, v in ad.items()})
    meta = {**(extra or {}), "kind": KIND, "scaling": json.dumps(scaling)}
    data = save(tensors, metadata=meta)
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def resolve_weights_file(plan_path: str | Path, name: str, given: str | Path | None) -> Path:
    """The recovered-weights file of a plan: ``given`` (the user's --recovered), else the
    plain file ``name`` beside the plan (a name with a folder part is refused)."""
    if given is not None:
        return Path(given)
    if Path(name).name != name or not name.endswith(".safetensors"):
        raise UserInputError(f"the plan's recovery.weights_file '{name}' is not a plain "
                             "*.safetensors file name: pass --recovered FILE")
    return Path(plan_path).parent / name


def read_recovered(path: str | Path, sha256: str) -> RecoveredWeights:
    """Read a recovered-weights file whose sha256 must be ``sha256`` (the plan's).

    Raises:
        UserInputError: missing, damaged or another plan's file (one line naming it).
    """
    p = Path(path)
    if not p.is_file():
        raise UserInputError(f"recovered weights '{p}' not found: keep the file the search "
                             "wrote beside the plan, or pass --recovered FILE")
    digest = file_sha256(p)
    if digest != sha256:
        raise UserInputError(f"recovered weights '{p}' have sha256 {digest[:12]}, the plan "
                             f"expects {sha256[:12]}: pass the file written with this plan")
    try:
        with safe_open(str(p), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except (OSError, SafetensorError) as exc:
        raise UserInputError(f"recovered weights '{p}' cannot be read: {exc}") from None
    if meta.get("kind") != KIND:
        raise UserInputError(f"'{p}' is not an autoplan recovered-weights file")
    weights: dict[str, Tensor] = {}
    adapters: dict[str, dict[str, Tensor]] = {}
    for key, t in tensors.items():
        layer, _, what = key.rpartition(".")
        if what == "weight":
            weights[layer] = t
        else:
            adapters.setdefault(layer, {})[what] = t
    return RecoveredWeights(weights, adapters, json.loads(meta.get("scaling", "null")), digest)


__all__ = ["RecoveredWeights", "SUFFIX", "file_sha256", "read_recovered",
           "resolve_weights_file", "weights_path_for", "write_recovered"]
