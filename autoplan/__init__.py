"""autoplan: hardware-aware per-layer sparsity x precision planning for LLM inference."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autoplan")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
