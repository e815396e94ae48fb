"""The safetensors file format, read and written without the library's whole-file copies:
its dtype names, a shard's header, and a file as parts for ``atomic.write_parts_atomic``.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

from autoplan.errors import UserInputError

# safetensors dtype name -> torch dtype (the format's names, safetensors/src/tensor.rs)
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
          "I8": torch.int8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E5M2": torch.float8_e5m2, "I16": torch.int16, "U16": torch.uint16,
          "U32": torch.uint32, "U64": torch.uint64}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def read_header(path: Path) -> tuple[dict, int]:
    """A shard's header and the byte offset its tensor data starts at.

    Raises:
        UserInputError: the file is shorter than the header's length field.
    """
    with Path(path).open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise UserInputError(f"{path} is not a safetensors file (too short); re-save the model")
        (n,) = struct.unpack("<Q", head)
        return json.loads(fh.read(n)), 8 + n


def safetensors_parts(tensors: dict[str, torch.Tensor]) -> Iterator[memoryview | bytes]:
    """A safetensors file of ``tensors`` as the header then each tensor's own memory, for
    ``write_parts_atomic``. ``safetensors.torch.save`` returns the whole file as one bytes
    object: for a 262k vocabulary the reference log-probs are 0.75 GiB, and that copy (plus
    the one it is joined from) was the in-memory search's peak."""
    header: dict[str, dict] = {}
    offset = 0
    flat = {name: t.contiguous() for name, t in tensors.items()}
    for name, t in flat.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    yield len(text).to_bytes(8, "little") + text
    for t in flat.values():
        if t.numel():
            yield memoryview(t.numpy()).cast("B")


__all__ = ["DTYPES", "read_header", "safetensors_parts"]
