"""Block-boundary hidden states between the forward and the reverse pass.

Kept on the CPU (the default: (blocks + 1) x tokens x hidden x 4 bytes, 2.7 GB for a 70B
model at 1,024 calibration tokens), or written to files under a folder when even that is
too much for the host (`--offload-dir`); either way off the device.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor


class BoundaryStore:
    """Block index -> the list of per-batch hidden states that enter that block."""

    def __init__(self, folder: Path | None = None) -> None:
        self._mem: dict[int, list[Tensor]] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="autoplan-states-", dir=folder)) if folder else None

    def put(self, i: int, hidden: list[Tensor]) -> None:
        cpu = [h.detach().to("cpu") for h in hidden]
        if self._dir is None:
            self._mem[i] = cpu
        else:
            torch.save(cpu, self._dir / f"block{i}.pt")

    def pop(self, i: int) -> list[Tensor]:
        if self._dir is None:
            return self._mem.pop(i)
        path = self._dir / f"block{i}.pt"
        out = torch.load(path, weights_only=True)
        path.unlink()
        return out

    def close(self) -> None:
        self._mem.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


__all__ = ["BoundaryStore"]
