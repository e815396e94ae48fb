"""Real-model measurements cached on disk (one JSON file each, written atomically), keyed by
everything a measurement depends on (the reference, calibration tokens, compression
settings and solver numerics, slices' tokens, the compressed layers), so a rerun over the
same model measures no candidate twice. Evaluators with a prompt suite or gates are not
cached. docs/architecture.md, "Compare and report".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.atomic import write_text_atomic
from autoplan.compress import CompressionSettings
from autoplan.numerics import signature
from autoplan.quality.evaluator import QualityResult
from autoplan.streaming.candidates import Evaluator

CACHE_VERSION = 1


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class MeasurementStore:
    """The measurements of one context (`measurement_store`), one file per candidate."""

    folder: Path

    def _path(self, key: tuple) -> Path:
        return self.folder / f"{_digest(key)[:32]}.json"

    def get(self, key: tuple) -> tuple[QualityResult, dict] | None:
        try:
            doc = json.loads(self._path(key).read_text())
            if doc.get("key") != json.loads(json.dumps(key)):
                return None  # another candidate under the same name: measured again
            return QualityResult(**doc["quality"]), doc["audit"]
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def put(self, key: tuple, quality: QualityResult, audit: dict) -> None:
        write_text_atomic(self._path(key), json.dumps(
            {"key": key, "quality": dataclasses.asdict(quality), "audit": audit}),
            fsync=False)


def measurement_store(cache_dir: Path, *, reference_key: str, calib_hash: str,
                      settings: CompressionSettings, evaluator: Evaluator
                      ) -> MeasurementStore | None:
    """The store of one measurement context under ``cache_dir``; None for an evaluator whose
    results the key cannot pin down (a prompt suite or gates)."""
    if getattr(evaluator, "suite_reference", None) is not None or \
            getattr(evaluator, "gates", ()):
        return None
    slices = getattr(evaluator, "slice_reference", None)
    context = {"version": CACHE_VERSION, "reference": reference_key, "calibration": calib_hash,
               "prune_score": str(settings.prune_score),
               "quant_method": str(settings.quant_method),
               "solver_threads": settings.solver_threads, "numerics": signature(),
               "slices": slices.slices.content_hash if slices is not None else None}
    return MeasurementStore(Path(cache_dir) / _digest(context)[:32])


__all__ = ["CACHE_VERSION", "MeasurementStore", "measurement_store"]
