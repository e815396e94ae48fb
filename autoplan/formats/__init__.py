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
    builtin.py    one FormatSpec per Precision (imported here, so the registry is complete)

How to add a precision (e.g. a GGUF block type):
1. add its member to ``Precision`` (registry.py) -- the closed vocabulary the CLI, pydantic
   and type checkers see;
2. register one ``FormatSpec`` for it (in builtin.py, or in your own module imported from
   here): its ``PrecisionInfo``; ``weight`` and ``activation`` scheme factories (reuse a
   scheme from schemes.py, or add a ``Scheme`` subclass that matches the engine's rounding
   bit for bit); for each of compressed-tensors, modelopt and onnx either its name
   (``CompressedTensorsName``, ``ModelOptName``, ``OrtNode``) or ``Refused("why")``; the
   microbenchmark ``kernels`` per sparsity token; other exporters in ``other`` (e.g.
   ``other={"gguf": "Q4_0"}``); registering the same precision twice raises;
3. say where engines accelerate it in autoplan/data/runtimes.toml (and offer it in a
   search_spaces/*.toml);
4. tests: tests/unit/test_format_registry.py walks every spec (schemes, bits, exporter
   names); add a round-trip test of its numerics against the engine's own quantizer.
Everything else (RTN, GPTQ, the simulation, cost model, exporters, kernels) asks the
registry, so nothing else needs an edit.
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
