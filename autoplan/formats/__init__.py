"""Number formats: the search vocabulary, their numerics, and the format registry.

Reasoning and sources: docs/modules.md.
"""

from autoplan.formats.choice import DENSE, Choice, Sparsity, parse_choices
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
from autoplan.formats.plugins import load_plugins  # noqa: E402,I001

# formats other packages register (entry-point group "autoplan.formats"): at import, so the
# CLI knows their names; the built-in specs register on the first spec lookup instead
load_plugins()

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
    "parse_choices",
    "register_format",
    "registered_formats",
]
