"""The seeds a search takes (no torch: the CLI checks `--seed` before any work)."""

# Seeds reach torch, numpy (RandomState takes 0 <= seed < 2**32) and Optuna's samplers, and
# each later round adds its index: a 31-bit range is valid for all of them.
MAX_SEED = 2**31 - 1

__all__ = ["MAX_SEED"]
