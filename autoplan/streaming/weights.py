"""Read a safetensors checkpoint one tensor at a time, in the checkpoint's dtype.

Each read opens the shard (memory-mapped by safetensors), copies out the named tensors and
closes it again, so the pages of blocks already processed do not stay mapped into this
process: resident memory is one block, not the file.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open

from autoplan.errors import UserInputError

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
           "I8": torch.int8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn}


def _header(path: Path) -> dict:
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise UserInputError(f"{path} is not a safetensors file (too short); re-save the model")
        (n,) = struct.unpack("<Q", head)
        return json.loads(fh.read(n))


class CheckpointReader:
    """Name -> (shard, dtype, shape) for every tensor of an HF safetensors folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.files: dict[str, Path] = {}
        self.meta: dict[str, tuple[str, tuple[int, ...]]] = {}
        shards = sorted(self.folder.glob("*.safetensors"))
        if not shards:
            raise UserInputError(f"'{folder}' has no *.safetensors weights; pass a folder "
                                 "written by save_pretrained")
        for shard in shards:
            for name, info in _header(shard).items():
                if name == "__metadata__":
                    continue
                self.files[name] = shard
                self.meta[name] = (info["dtype"], tuple(info["shape"]))

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def names(self) -> list[str]:
        return list(self.files)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype most of the checkpoint's bytes are stored in."""
        size: dict[str, int] = defaultdict(int)
        for dt, shape in self.meta.values():
            size[dt] += int(torch.Size(shape).numel())
        return _DTYPES.get(max(size, key=size.__getitem__), torch.float32)

    def nbytes(self, names: Iterable[str]) -> int:
        total = 0
        for n in names:
            dt, shape = self.meta[n]
            total += int(torch.Size(shape).numel()) * _DTYPES.get(dt, torch.float32).itemsize
        return total

    def read(self, names: Iterable[str], dtype: torch.dtype | None = None
             ) -> dict[str, torch.Tensor]:
        """The named tensors, copied out of their shards (which are closed again).

        With `dtype`, each floating tensor is converted as it is read, so at most one tensor
        exists in both the checkpoint's dtype and `dtype` at a time (not a whole block).
        """
        by_file: dict[Path, list[str]] = defaultdict(list)
        for n in names:
            by_file[self.files[n]].append(n)
        out: dict[str, torch.Tensor] = {}
        for shard, shard_names in by_file.items():
            with safe_open(str(shard), framework="pt", device="cpu") as fh:
                for n in shard_names:
                    t = fh.get_tensor(n)
                    convert = dtype is not None and t.is_floating_point() and t.dtype != dtype
                    out[n] = t.to(dtype) if convert else t.clone()
                    del t
        return out


__all__ = ["CheckpointReader"]
