"""Where autoplan keeps converted models and per-file hashes, and how it writes them safely.

The root is ``$AUTOPLAN_CACHE`` when set, else ``~/.cache/autoplan``. Everything written here
goes through a temporary sibling and one ``os.replace``/``rename``, so an interrupted write
never leaves a half file or half folder that a later run would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """The autoplan cache folder (``$AUTOPLAN_CACHE`` or ``~/.cache/autoplan``)."""
    env = os.environ.get("AUTOPLAN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "autoplan"


def models_dir() -> Path:
    """Folder holding converted HF model folders."""
    return cache_root() / "models"


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``dest`` only if the block finishes.

    The temporary folder sits beside ``dest`` (same filesystem, so the rename is atomic). If
    another process finished the same folder first, ours is discarded: both hold the same
    content by construction (the name carries a content hash).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        yield tmp
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as sorted-key JSON through a temp file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> Any:
    """Read a JSON cache file; a missing or corrupt file reads as ``None`` (a cache miss)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["atomic_dir", "cache_root", "models_dir", "read_json", "write_json_atomic"]
