"""Resumable recovery: the trainable tensors and the optimizer state, every few steps.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from autoplan.atomic import write_bytes_atomic, write_json_atomic

TENSORS = "recovery.safetensors"
STATE = "recovery.json"


@dataclass
class Checkpoint:
    step: int
    losses: list[float]
    elapsed_s: float
    params: dict[str, Tensor] = field(repr=False)
    moments: dict[str, dict[str, Tensor]] = field(repr=False)  # name -> exp_avg, exp_avg_sq
    initial: float = 0.0  # the unrecovered model's loss (the divergence check's reference)


def save_checkpoint(folder: Path, key: str, ck: Checkpoint) -> None:
    tensors = {f"param.{n}": t.detach().contiguous() for n, t in ck.params.items()}
    for n, m in ck.moments.items():
        tensors.update({f"adam.{n}.{k}": v.detach().contiguous() for k, v in m.items()})
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(folder / TENSORS, save(tensors, metadata={"step": str(ck.step),
                                                                  "key": key}))
    write_json_atomic(folder / STATE, {"key": key, "step": ck.step, "losses": ck.losses,
                                       "elapsed_s": ck.elapsed_s, "initial": ck.initial})


def load_checkpoint(folder: Path | None, key: str) -> Checkpoint | None:
    """The checkpoint of this run in ``folder``, or None (none, another run's, or damaged)."""
    if folder is None or not (folder / STATE).is_file() or not (folder / TENSORS).is_file():
        return None
    try:
        state = json.loads((folder / STATE).read_text())
        with safe_open(str(folder / TENSORS), framework="pt") as fh:
            meta = fh.metadata() or {}
            if state.get("key") != key or meta.get("key") != key or \
                    meta.get("step") != str(state.get("step")):
                return None
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except (OSError, ValueError, KeyError, SafetensorError):
        return None
    params = {k.removeprefix("param."): v for k, v in tensors.items() if k.startswith("param.")}
    moments: dict[str, dict[str, Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("adam."):
            name, _, which = k.removeprefix("adam.").rpartition(".")
            moments.setdefault(name, {})[which] = v
    return Checkpoint(int(state["step"]), [float(x) for x in state["losses"]],
                      float(state["elapsed_s"]), params, moments, float(state["initial"]))


def clear_checkpoint(folder: Path | None) -> None:
    """Remove a finished run's checkpoint files (the folder itself only when empty)."""
    if folder is None:
        return
    for name in (STATE, TENSORS):
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def adam_moments(opt: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, dict[str, Tensor]]:
    """AdamW's per-parameter moments, by parameter name."""
    out = {}
    for p, st in opt.state.items():
        if "exp_avg" in st:
            out[names[id(p)]] = {"exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"]}
    return out


def restore_moments(opt: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter],
                    moments: dict[str, dict[str, Tensor]], step: int) -> None:
    for name, m in moments.items():
        p = params[name]
        # the fused AdamW keeps its step count on the parameter's device
        opt.state[p] = {"step": torch.tensor(float(step), device=p.device),
                        "exp_avg": m["exp_avg"].clone(), "exp_avg_sq": m["exp_avg_sq"].clone()}


__all__ = ["Checkpoint", "adam_moments", "clear_checkpoint", "load_checkpoint",
           "restore_moments", "save_checkpoint"]
