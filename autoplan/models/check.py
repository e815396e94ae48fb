"""Cheap checks that a weights file is whole, before anything spends minutes loading it.

A `.safetensors` file is an 8-byte little-endian header length, a JSON header mapping each
tensor to its byte range, then the tensor bytes. A zero-byte, truncated, padded or foreign file is
found from the header and the file size alone (no tensor is read) and named precisely; then
the safetensors library opens the header itself (``safe_open``: dtype x shape against each
byte range, contiguous tensors), so what it would refuse later is refused here too. Either
way it is one line, instead of the loader's `SafetensorError` traceback after the model
was resolved. Search (preflight), export and apply all call `check_safetensors`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from autoplan.errors import UserInputError

# The safetensors library refuses headers above 100 MB; so do we, before reading one.
MAX_HEADER_BYTES = 100_000_000
_FIX = "re-download it, or re-save the model with save_pretrained(dir, safe_serialization=True)"


def _problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file, or None when it is."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes, too short for a header"
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > min(MAX_HEADER_BYTES, size - 8):
            return f"its header claims {n} bytes, the file has {size - 8} after the length"
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            return f"tensor '{name}' has no valid data_offsets"
        end = max(end, offsets[1])
    data = size - 8 - n
    if end > data:
        return f"truncated: its tensors need {end} bytes of data, the file holds {data}"
    if end < data:
        return f"{data - end} bytes follow the last tensor"
    return None


def _check_file(p: Path) -> None:
    try:
        problem = _problem(p)
    except OSError as exc:
        raise UserInputError(f"cannot read '{p}': {exc.strerror}") from None
    if not problem:
        problem = _library_problem(p)
    if problem:
        raise UserInputError(f"'{p}' is not a valid safetensors file ({problem}): {_FIX}")


def _library_problem(p: Path) -> str | None:
    """What the safetensors library says of the header, or None when it opens it."""
    from safetensors import safe_open

    try:
        with safe_open(str(p), framework="pt") as fh:
            fh.keys()
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: all one message
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def check_safetensors(path: str | Path) -> None:
    """Refuse a `.safetensors` file that is empty, truncated, padded or not safetensors.

    Args:
        path: one `.safetensors` file, or an HF model folder (every `*.safetensors` in it).
            A path that does not exist is left to the model resolver to report.

    Raises:
        UserInputError: one line naming the file, what is wrong and the fix.
    """
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p] if p.exists() else []
    for file in files:
        _check_file(file)


def tensor_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every `*.safetensors` header of a folder (no tensor read);
    call after `check_safetensors`."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with file.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        shapes.update({name: tuple(entry["shape"]) for name, entry in header.items()
                       if name != "__metadata__"})
    return shapes


__all__ = ["check_safetensors", "tensor_shapes"]
