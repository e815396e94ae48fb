"""Number formats: the search vocabulary, their numerics, and the format registry.

Public names: ``Precision``, ``PrecisionInfo``, ``Sparsity``, ``Choice``, ``DENSE`` (the
vocabulary of plans, search spaces and the CLI), ``FormatSpec`` and ``format_spec`` (the
registry), the exporter naming types, and the element casts and schemes in
``autoplan.formats.elements`` / ``autoplan.formats.schemes``.

Layout (imports point down only):
    registry.py   Precision, PrecisionInfo, FormatSpec, register_format / format_spec
    choice.py     Sparsity, Choice, DENSE
    elements.py   bit-exact element casts (FP8, E2M1, E8M0, 16-bit)
    schemes.py    how a format turns a slab into codes, scales and zero points
    gguf_blocks.py  llama.cpp's GGUF block types (their schemes, byte layout, Q8_1 term)
    builtin.py    one FormatSpec per Precision (registered on the first spec lookup: its
                  schemes import torch, which naming a format must not pay for)

How to add a precision: see the docstring of autoplan/formats/registry.py. A format may live
in a module of its own (examples/formats/int8_g128.py): it calls ``Precision.define`` and
``register_format``, and loads with autoplan when its package lists the module in the
``autoplan.formats`` entry-point group.
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
    "register_format",
    "registered_formats",
]
