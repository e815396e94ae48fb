"""Where autoplan keeps converted models and per-file hashes, and how it writes them safely.

The root is ``$AUTOPLAN_CACHE`` when set, else ``~/.cache/autoplan``. Everything written here
goes through a temporary sibling and one ``os.replace``/``rename``, so an interrupted write
never leaves a half file or half folder that a later run would trust.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autoplan.atomic import atomic_new_dir
from autoplan.atomic import write_json_atomic as write_json_atomic_


def cache_root() -> Path:
    """The autoplan cache folder (``$AUTOPLAN_CACHE`` or ``~/.cache/autoplan``)."""
    env = os.environ.get("AUTOPLAN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "autoplan"


def models_dir() -> Path:
    """Folder holding converted HF model folders."""
    return cache_root() / "models"


def atomic_dir(dest: Path):  # noqa: ANN201 - a context manager
    """A temp folder that becomes ``dest`` if the block finishes; if another process finished
    the same folder first, ours is discarded (the name carries a content hash)."""
    return atomic_new_dir(dest, complete=lambda d: (d / "config.json").is_file())


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as sorted-key JSON atomically (``autoplan.atomic``)."""
    write_json_atomic_(path, data, indent=None)


def read_json(path: Path) -> Any:
    """Read a JSON cache file; a missing or corrupt file reads as ``None`` (a cache miss)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["atomic_dir", "cache_root", "models_dir", "read_json", "write_json_atomic"]
