"""Where autoplan keeps its caches: ``$AUTOPLAN_CACHE`` when set, else ``~/.cache/autoplan``
(profiles, measurements, references, converted models, cost tables, engines)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The autoplan cache folder (``$AUTOPLAN_CACHE`` or ``~/.cache/autoplan``)."""
    env = os.environ.get("AUTOPLAN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "autoplan"


__all__ = ["cache_root"]
