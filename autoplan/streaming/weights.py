"""Read a safetensors checkpoint one tensor at a time, in the checkpoint's dtype.

Each tensor is read with plain file reads into a buffer of its own, not through a memory
map: the pages of a mapped shard count in the process's resident set until it is closed, so
reading a 1.2 GB block through safetensors' mmap and converting it to fp32 held the block
twice (the mapped bf16 pages and the fp32 copy). Read this way, the page cache keeps the
file and the process holds only what it converted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import torch
from autoplan.errors import UserInputError
from autoplan.safetensors_io import DTYPES, read_header

class CheckpointReader:
    """Name -> (shard, dtype, shape) for every tensor of an HF safetensors folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.files: dict[str, Path] = {}
        self.meta: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.offsets: dict[str, tuple[int, int]] = {}  # absolute byte range in its shard
        shards = sorted(self.folder.glob("*.safetensors"))
        if not shards:
            raise UserInputError(f"'{folder}' has no *.safetensors weights; pass a folder "
                                 "written by save_pretrained")
        for shard in shards:
            header, data_start = read_header(shard)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                self.files[name] = shard
                self.meta[name] = (info["dtype"], tuple(info["shape"]))
                self.offsets[name] = (data_start + info["data_offsets"][0],
                                      data_start + info["data_offsets"][1])

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
        return DTYPES.get(max(size, key=size.__getitem__), torch.float32)

    def nbytes(self, names: Iterable[str]) -> int:
        total = 0
        for n in names:
            dt, shape = self.meta[n]
            total += int(torch.Size(shape).numel()) * DTYPES.get(dt, torch.float32).itemsize
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
            with shard.open("rb", buffering=0) as fh:
                for n in sorted(shard_names, key=self.offsets.__getitem__):  # file order
                    t = self._read_one(fh, n)
                    convert = dtype is not None and t.is_floating_point() and t.dtype != dtype
                    out[n] = t.to(dtype) if convert else t
                    del t
        return out

    def _read_one(self, fh: BinaryIO, name: str) -> torch.Tensor:
        """One tensor, read into a buffer the returned tensor owns."""
        dt, shape = self.meta[name]
        if dt not in DTYPES:
            raise UserInputError(f"{self.files[name].name}: tensor {name} is stored as {dt}, "
                                 "which autoplan does not read; re-save it as BF16/F16/F32")
        begin, end = self.offsets[name]
        dtype = DTYPES[dt]
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        buf = bytearray(end - begin)
        fh.seek(begin)
        view = memoryview(buf)
        got = 0
        while got < len(buf):  # readinto may return short counts
            n = fh.readinto(view[got:])
            if not n:
                raise UserInputError(f"{self.files[name]} ends inside tensor {name}: the "
                                     "file is truncated; re-save or re-download it")
            got += n
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)


__all__ = ["CheckpointReader"]
