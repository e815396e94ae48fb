"""Per-layer sensitivity profile (the additive quality surrogate) and its calibration pass."""

from autoplan.sensitivity.capture import Captured, capture
from autoplan.sensitivity.profile import (SensitivityProfile, build_profile, cache_path,
                                          calibration_key)

__all__ = ["Captured", "SensitivityProfile", "build_profile", "cache_path", "calibration_key",
           "capture"]
