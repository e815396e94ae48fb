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

How to add a precision: see the docstring of autoplan/formats/registry.py.
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
