"""Where autoplan keeps converted models and per-file hashes, and how it writes them safely.

The root is ``$AUTOPLAN_CACHE`` when set, else ``~/.cache/autoplan``. Everything written here
goes through a temporary sibling and one ``os.replace``/``rename``, so an interrupted write
never leaves a half file or half folder that a later run would trust.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoplan.cache_dir import cache_root
from autoplan.atomic import write_json_atomic as write_json_atomic_


def models_dir() -> Path:
    """Folder holding converted HF model folders."""
    return cache_root() / "models"


def is_model_folder(folder: Path) -> bool:
    """Whether a converted model folder is complete (the content-addressed cache's test)."""
    return (folder / "config.json").is_file()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as sorted-key JSON atomically (``autoplan.atomic``)."""
    write_json_atomic_(path, data, indent=None)


def read_json(path: Path) -> Any:
    """Read a JSON cache file; a missing or corrupt file reads as ``None`` (a cache miss)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["cache_root", "is_model_folder", "models_dir", "read_json", "write_json_atomic"]
