"""Number formats: the search vocabulary, their numerics, and the format registry.

Reasoning and sources: docs/modules.md.
"""

from autoplan.formats.choice import DENSE, Choice, Sparsity
from autoplan.formats.registry import (
    EXPORTERS,
    CompressedTensorsName,
    FormatSpec,
    ModelOptName,
    OrtNode,
    Precision,
    PrecisionInfo,
    Refused,
    format_spec,
    register_format,
    registered_formats,
)
from autoplan.formats import builtin  # noqa: E402,F401,I001 - registers the built-in specs
from autoplan.formats.plugins import load_plugins  # noqa: E402,I001

load_plugins()  # formats other packages register (entry-point group "autoplan.formats")

__all__ = [
    "DENSE",
    "EXPORTERS",
    "Choice",
    "CompressedTensorsName",
    "FormatSpec",
    "ModelOptName",
    "OrtNode",
    "Precision",
    "PrecisionInfo",
    "Refused",
    "Sparsity",
    "format_spec",
    "register_format",
    "registered_formats",
]
