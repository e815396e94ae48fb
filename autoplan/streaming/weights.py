"""Read a safetensors checkpoint one tensor at a time, in the checkpoint's dtype (plain file
reads, not a memory map), gpt-oss's MXFP4 experts decoded as the in-memory loader does.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import torch

from autoplan.errors import UserInputError
from autoplan.safetensors_io import DTYPES, read_header

# the suffixes of an MXFP4 tensor's parts in gpt-oss's checkpoints: blocks uint8 [E, out,
# in / 32, 16] (two E2M1 codes a byte, low nibble first) and scales uint8 E8M0 [E, out, in / 32]
_BLOCKS, _SCALES = "_blocks", "_scales"
# the tensors transformers' MXFP4 loader decodes (the routed experts' two projections)
_PACKED = ("gate_up_proj", "down_proj")


class CheckpointReader:
    """Name -> (shard, dtype, shape) for every tensor of an HF safetensors folder.

    Args:
        folder: the HF safetensors folder.
        mxfp4: the config says the checkpoint's experts are MXFP4 (gpt-oss's
            `quantization_config`): each `<name>_blocks` / `<name>_scales` pair is also
            readable as `<name>`, the stacked float tensor [E, in, out] an unquantized
            checkpoint holds.
    """

    def __init__(self, folder: Path, *, mxfp4: bool = False) -> None:
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
        self.packed: dict[str, tuple[str, str]] = {}  # name -> (its blocks, its scales)
        if mxfp4:
            for name in self.files:
                base = name.removesuffix(_BLOCKS)
                if base != name and base.endswith(_PACKED) and base not in self.files:
                    self._add_packed(base)

    def _add_packed(self, name: str) -> None:
        blocks, scales = name + _BLOCKS, name + _SCALES
        if scales not in self.files:
            raise UserInputError(f"'{self.folder}' has {blocks} but not {scales}, which an "
                                 "MXFP4 tensor needs; re-download or re-save the checkpoint")
        (bdt, bshape), (sdt, sshape) = self.meta[blocks], self.meta[scales]
        if (bdt, sdt) != ("U8", "U8") or len(bshape) != 4 or bshape[-1] != 16 \
                or sshape != bshape[:-1]:
            raise UserInputError(
                f"'{self.folder}': {blocks} is {bdt} {list(bshape)} and {scales} {sdt} "
                f"{list(sshape)}, not MXFP4 (U8 [E, out, in/32, 16] and U8 [E, out, in/32]); "
                "re-download or re-save the checkpoint")
        self.packed[name] = (blocks, scales)

    def __contains__(self, name: str) -> bool:
        return name in self.files or name in self.packed

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
        """Bytes on disk of `names` (an MXFP4 tensor: its blocks and scales)."""
        total = 0
        for n in names:
            for part in self.packed.get(n, (n,)):
                dt, shape = self.meta[part]
                total += int(torch.Size(shape).numel()) * DTYPES.get(dt, torch.float32).itemsize
        return total

    def read(self, names: Iterable[str], dtype: torch.dtype | None = None
             ) -> dict[str, torch.Tensor]:
        """The named tensors, copied out of their shards (which are closed again).

        With `dtype`, each floating tensor is converted as it is read, so at most one tensor
        exists in both the checkpoint's dtype and `dtype` at a time (not a whole block). An
        MXFP4 tensor is decoded to `dtype` (bf16 without one: it holds every MXFP4 value
        exactly), with only its packed parts and one expert's scratch beside the result.
        """
        names = list(names)
        out = self._read_stored([n for n in names if n not in self.packed], dtype)
        for n in names:
            if n in self.packed:
                out[n] = self._decode_mxfp4(n, dtype or torch.bfloat16)
        return out

    def _decode_mxfp4(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The stacked [E, in, out] tensor (transformers' layout) of MXFP4 `name`.

        transformers' own decoder (the one `Mxfp4Config(dequantize=True)` runs for the
        in-memory loader) gives the same values bit for bit: each weight is an E2M1 value
        times a power of two, exact in bf16 and fp32, and decoding is elementwise, so
        decoding one expert at a time changes nothing but the peak. Called on the whole
        tensor it would hold two fp32 copies plus int32 indices at once.
        """
        try:
            from transformers.integrations.mxfp4 import convert_moe_packed_tensors
        except ImportError:  # pragma: no cover - transformers before gpt-oss (4.55)
            raise UserInputError("reading MXFP4 experts needs transformers>=4.55 (gpt-oss); "
                                 "pip install -U transformers") from None
        blocks_name, scales_name = self.packed[name]
        parts = self._read_stored([blocks_name, scales_name], None)
        blocks, scales = parts.pop(blocks_name), parts.pop(scales_name)
        experts, rows, groups, _ = blocks.shape
        # stored order, [E, out, in]: each expert's [out, in] weight (what autoplan's linears
        # hold) is then a contiguous slice, so taking it copies nothing
        out = torch.empty(experts, rows, groups * 32, dtype=dtype)
        for e in range(experts):
            decoded = convert_moe_packed_tensors(blocks[e:e + 1], scales[e:e + 1], dtype=dtype)
            out[e] = decoded[0].T  # the decoder returns transformers' [1, in, out]
            del decoded
        return out.transpose(1, 2)

    def _read_stored(self, names: list[str], dtype: torch.dtype | None
                     ) -> dict[str, torch.Tensor]:
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
