"""Damaged copies of a whole ``.safetensors`` file, one per way a download or a save breaks.

Shared by the search refusal tests and the export/apply ones, so both paths are checked
against the same damages by the one ``autoplan.models.check.check_safetensors``.
"""

from __future__ import annotations

import json
import struct

# damage -> what the one-line refusal says
DAMAGES = {
    "zero-byte": "too short for a header",
    "truncated": "truncated",
    "garbage": "header claims",
    "header-only": "truncated",
    "padded": "bytes follow the last tensor",
    "bad-shape": "invalid shape, data type, or offset",  # found by the library's own check
}


def damage(whole: bytes, kind: str) -> bytes:
    """``whole`` (a valid safetensors file's bytes) damaged as ``kind`` (a DAMAGES key)."""
    (n,) = struct.unpack("<Q", whole[:8])
    if kind == "zero-byte":
        return b""
    if kind == "truncated":
        return whole[: len(whole) // 2]
    if kind == "garbage":
        return b"\x89PNG\r\n\x1a\n" + b"\x00" * 4096
    if kind == "header-only":
        return whole[: 8 + n]
    if kind == "padded":
        return whole + b"\x00" * 7
    if kind == "bad-shape":  # one tensor claims twice its elements; byte ranges unchanged
        header = json.loads(whole[8 : 8 + n])
        name = next(k for k in header if k != "__metadata__")
        header[name]["shape"] = [2, *header[name]["shape"]]
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + whole[8 + n :]
    raise ValueError(f"unknown damage {kind}")
