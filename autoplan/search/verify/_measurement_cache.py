"""Real-model measurements cached on disk, so a rerun (another budget, target set or
operating point over the same model) does not measure the same candidate again.

A measurement is a pure function of what its key holds: the reference it is compared with
(`reference_cache.reference_key`: the model's content, the evaluation tokens, execution,
device, torch version and thread count), the calibration tokens (Wanda/SparseGPT masks,
GPTQ), the compression settings and the solvers' numerics (`autoplan.numerics`), the KL
slices' tokens, and the candidate's compressed layers (`verify.decisions_key`). Nothing else
can change its bits, so a stored one is the one a new pass would give. Evaluators with a
prompt suite or gates (lm-eval, long context) are not cached: their scores depend on task
files and code outside that key.

One JSON file per measurement (no pickle), written atomically; a file that cannot be read,
or whose stored decisions are not the ones asked for, is measured again.
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
