"""Refuse unreadable .safetensors files in one line, before any model is built.

A truncated, zero-byte or garbage file otherwise surfaces deep inside transformers as a raw
``SafetensorError`` traceback. Opening a file with ``safe_open`` reads and validates its
header (including that the data section is as long as the header says) without reading
the tensors, so the check costs milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from autoplan.errors import UserInputError


def check_safetensors(folder: str | Path) -> None:
    """Open the header of every ``*.safetensors`` file in ``folder``.

    Raises:
        UserInputError: one file is unreadable; the message names it and the fix.
    """
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as fh:
                fh.keys()
        except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: all one message
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserInputError(
                f"'{path}' is not a readable safetensors file ({first}): re-download or "
                "re-save the model") from None


__all__ = ["check_safetensors"]
