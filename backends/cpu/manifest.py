"""The manifest.json of a CPU artifact: its name, format tag and version, and the check that
a folder holds one, without importing ONNX or torch (`bench --artifact` asks it first)."""

from __future__ import annotations

from pathlib import Path

from autoplan.errors import UserInputError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "autoplan-cpu-onnx"
# 2: each MatMulNBits layer records the accuracy_level its format implies (version 1 had one
# artifact-wide level, so its layer formats do not say how the kernel rounded).
MANIFEST_VERSION = 2


def require_manifest(path: str | Path) -> Path:
    """The folder at `path`, refused when it holds no manifest.json (also a file, or nothing,
    at `path`).

    Raises:
        UserInputError: not a CPU artifact; the message says how to make one.
    """
    folder = Path(path)
    if not (folder / MANIFEST).is_file():
        raise UserInputError(f"'{path}' is not a CPU artifact (no {MANIFEST}): create one "
                             "with `autoplan apply PLAN --model M --out DIR`")
    return folder


__all__ = ["MANIFEST", "MANIFEST_FORMAT", "MANIFEST_VERSION", "require_manifest"]
