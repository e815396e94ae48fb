"""Can a file be written at a path? Checked before any work, without creating anything."""

from __future__ import annotations

import os
from pathlib import Path

from autoplan.errors import UserInputError


def check_writable_file(path: str | Path, what: str, fix: str) -> Path:
    """Refuse (one line naming ``fix``) a file path that could not be written later.

    The path must not be a folder, and its nearest existing ancestor must be a folder this
    process may create entries in (``os.access`` also reports a read-only file system).
    Missing folders in between are fine: the writers create them.

    Returns:
        The path, with ``~`` expanded.
    """
    p = Path(path).expanduser()
    folder = next((q for q in (p.parent, *p.parent.parents) if q.exists()), None)
    if p.is_dir():
        reason = "it is a folder"
    elif folder is None or not folder.is_dir():
        reason = f"'{folder}' is not a folder" if folder else "no folder above it exists"
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = f"'{folder}' is not writable"
    else:
        return p
    raise UserInputError(f"cannot write the {what} {p} ({reason}): {fix}")


__all__ = ["check_writable_file"]
