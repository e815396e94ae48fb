"""ONNX initializers kept out of memory: written to a data file as the graph is built, read
back one tensor at a time, and copied into the artifact's data file tensor by tensor.

A 262k-vocabulary model's fp32 embedding is 0.67 GB: held in the ModelProto (and again in
``onnx.save``'s byte copies) the export peaked at several times the model. Here a tensor is
in memory only while it is made (a transposed weight) or read (a layer being quantized).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

EXTERNAL_MIN = 1024  # bytes: smaller tensors stay inside the model (onnx.save's threshold)
CHUNK = 16 * 2**20  # bytes read or copied at a time


class TensorFile:
    """A data file tensors are appended to; each ``add`` returns the initializer that refers
    to its bytes there (the array itself is not kept)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._offset = 0

    def add(self, name: str, array: np.ndarray) -> TensorProto:
        arr = np.ascontiguousarray(array)
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        tensor.dims.extend(arr.shape)
        self._fh.write(arr.reshape(-1).view(np.uint8))
        _refer(tensor, self.path.name, self._offset, arr.nbytes)
        self._offset += arr.nbytes
        return tensor

    def close(self) -> None:
        self._fh.close()


def _refer(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    """Point `tensor` at `length` bytes of `location` from `offset` (ONNX external data)."""
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL


def _external(tensor: TensorProto) -> dict[str, str] | None:
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in tensor.external_data}


def read_array(tensor: TensorProto, base_dir: str | Path | None = None) -> np.ndarray:
    """An initializer as a numpy array, read from its data file when it has one (the proto
    is left as it is: ``numpy_helper.to_array`` would load the bytes into it)."""
    ext = _external(tensor)
    if ext is None:
        return onnx.numpy_helper.to_array(tensor)
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    count = int(np.prod(tensor.dims, dtype=np.int64))
    arr = np.fromfile(Path(base_dir or ".") / ext["location"], dtype=dtype, count=count,
                      offset=int(ext.get("offset", 0)))
    return arr.reshape(tuple(tensor.dims))


def tensor_bytes(tensor: TensorProto, base_dir: str | Path | None = None
                 ) -> Iterator[bytes | memoryview]:
    """An initializer's raw little-endian bytes, CHUNK at a time (one buffer, refilled:
    use each chunk before asking for the next)."""
    ext = _external(tensor)
    if ext is None:
        if tensor.HasField("raw_data"):
            yield tensor.raw_data
        else:
            yield onnx.numpy_helper.to_array(tensor).tobytes()
        return
    left = int(ext["length"]) if "length" in ext else _nbytes(tensor)
    buf = memoryview(bytearray(min(CHUNK, left)))
    with open(Path(base_dir or ".") / ext["location"], "rb") as fh:
        fh.seek(int(ext.get("offset", 0)))
        while left:
            n = fh.readinto(buf[:min(len(buf), left)])
            if not n:
                raise OSError(f"{ext['location']} ends inside tensor {tensor.name}")
            left -= n
            yield buf[:n]


def tensor_sha256(tensor: TensorProto, base_dir: str | Path | None = None) -> str:
    h = hashlib.sha256()
    for chunk in tensor_bytes(tensor, base_dir):
        h.update(chunk)
    return h.hexdigest()


def _nbytes(tensor: TensorProto) -> int:
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def save_streamed(model: onnx.ModelProto, model_path: str | Path, data_name: str,
                  base_dir: str | Path | None = None) -> None:
    """Save `model` with every initializer of EXTERNAL_MIN bytes or more in `data_name`
    beside it, written tensor by tensor in graph order: from the file it lies in (under
    `base_dir`) or from the proto (whose copy is then dropped). The data file holds exactly
    the graph's tensors (a weight the quantizer replaced leaves nothing behind)."""
    model_path = Path(model_path)
    data_path = model_path.parent / data_name
    offset = 0
    with open(data_path, "wb") as out:
        for tensor in model.graph.initializer:
            if _external(tensor) is None and _nbytes(tensor) < EXTERNAL_MIN:
                continue
            length = 0
            for chunk in tensor_bytes(tensor, base_dir):
                out.write(chunk)
                length += len(chunk)
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                tensor.ClearField(field)
            _refer(tensor, data_name, offset, length)
            offset += length
        out.flush()
        os.fsync(out.fileno())
    onnx.save_model(model, str(model_path))


__all__ = ["EXTERNAL_MIN", "TensorFile", "read_array", "save_streamed", "tensor_bytes",
           "tensor_sha256"]
