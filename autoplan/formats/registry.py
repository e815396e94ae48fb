"""The format registry: one FormatSpec per Precision, and the names the engines give it.

A ``FormatSpec`` is everything autoplan knows about one number format, in one place: how it
is stored and computed (``PrecisionInfo``, read by the cost model), how weights and
activations are rounded (the scheme factories, read by RTN, GPTQ and the simulation), and
how each exporter and kernel names it -- or why it refuses it. Code that needs a fact about
a format asks ``format_spec(precision)``; nothing else keeps a per-format table or an
``if precision is ...`` chain.

The registry behaves like compressed-tensors' compressor registry: registering a precision
twice raises, and a failed lookup lists every registered name.

How to add a precision (docs/architecture.md, "Adding a precision", lists the files the
fp8_b128 addition touched -- this module's enum, schemes.py, builtin.py, data rows, tests):
1. add its member to ``Precision`` (below) -- the closed vocabulary the CLI, pydantic and
   type checkers see;
2. register one ``FormatSpec`` for it (in builtin.py, or in a module of your own imported
   by autoplan/formats/__init__.py): its ``PrecisionInfo`` (bits, math, scale groups and,
   for a 2-D block format, ``block_rows``); ``weight`` and ``activation`` scheme factories
   (reuse a scheme from schemes.py, or add a ``Scheme`` subclass that matches the engine's
   rounding bit for bit); for each of compressed-tensors, modelopt and onnx either its name
   (``CompressedTensorsName``, ``ModelOptName``, ``OrtNode``) or ``Refused("why")``; the
   microbenchmark ``kernels`` per sparsity token; other exporters in ``other`` (e.g.
   ``other={"gguf": "Q4_0"}``); registering the same precision twice raises;
3. say where engines accelerate it in autoplan/data/runtimes.toml (and offer it in a
   search_spaces/*.toml);
4. tests: tests/unit/test_format_registry.py walks every spec (schemes, bits, exporter
   names) and round-trips every quantized one; add a test of its numerics against the
   engine's own quantizer, bit for bit, and read back each export that holds it.
Everything else (RTN, GPTQ, the simulation, cost model, search's fit check, exporters,
kernels) asks the registry, so nothing else needs an edit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from autoplan.errors import UnknownNameError, UnsupportedFormatError
from autoplan.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from autoplan.formats.schemes import Scheme


class Precision(str, Enum):
    """Number formats, by their canonical text. Each member has one registered FormatSpec.

    It stays a closed ``str`` Enum (not a registry-built type) so that click.Choice,
    pydantic, type checkers and ``Precision.NVFP4`` in code all see one fixed vocabulary;
    a test proves the enum and the registry list the same formats.
    """

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8_E4M3 = "fp8_e4m3"  # W8A8 FP8, per-channel weight scales, dynamic per-token activations
    FP8_E5M2 = "fp8_e5m2"
    INT8 = "int8"  # W8A8 INT8, per-channel symmetric weights, dynamic per-token activations
    INT8_WO = "int8_wo"  # W8A16
    INT4_G32 = "int4_g32"  # W4A16 group-wise, symmetric
    INT4_G64 = "int4_g64"
    INT4_G128 = "int4_g128"
    UINT4_G32 = "uint4_g32"  # W4A16 group-wise, asymmetric (codes 0..15, scale and zero point)
    UINT4_G64 = "uint4_g64"
    UINT4_G128 = "uint4_g128"
    NVFP4 = "nvfp4"  # E2M1 values, E4M3 scale per 16, FP32 tensor scale (W4A4)
    MXFP4 = "mxfp4"  # E2M1 values, E8M0 scale per 32 (W4A4)
    # DeepSeek-V3 block FP8: E4M3 weights with an FP32 scale per 128 x 128 block, E4M3 inputs
    # with a dynamic scale per token per 128 inputs (vLLM's per_token_group_quant_fp8).
    FP8_B128 = "fp8_b128"
    # ONNX Runtime MatMulNBits at accuracy_level 4: int4/int8 block weights x activations
    # rounded to int8 per block along K at run time (see the FormatSpecs in builtin.py).
    INT4A8_G32 = "int4a8_g32"
    INT4A8_G64 = "int4a8_g64"
    INT4A8_G128 = "int4a8_g128"
    UINT4A8_G32 = "uint4a8_g32"
    UINT4A8_G64 = "uint4a8_g64"
    UINT4A8_G128 = "uint4a8_g128"
    INT8A8_G128 = "int8a8_g128"
    # llama.cpp's GGUF block types (blocks of 32 along K, fp16 scale, *_1 also an fp16 min),
    # with activations quantized per block of 32 to Q8_0 (Q8_1 for the *_1 types) as
    # llama.cpp's CPU matmul does: autoplan/formats/gguf_blocks.py.
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"
    Q5_0 = "q5_0"
    Q5_1 = "q5_1"

    @classmethod
    def parse(cls, text: str) -> Precision:
        """Read a precision name (case-insensitive; fp8, int4, w8a8 and w8a16 are aliases)."""
        key = text.strip().lower().replace("-", "_")
        key = {"fp8": "fp8_e4m3", "int4": "int4_g128", "w8a16": "int8_wo", "w8a8": "int8"}.get(
            key, key
        )
        try:
            return cls(key)
        except ValueError:
            raise UnknownNameError("precision", text, [p.value for p in cls]) from None

    @property
    def spec(self) -> FormatSpec:
        """The registered FormatSpec."""
        return format_spec(self)

    @property
    def info(self) -> PrecisionInfo:
        """How the format is stored and computed (its FormatSpec's info)."""
        return format_spec(self).info


@dataclass(frozen=True)
class PrecisionInfo:
    """How a precision is stored and computed.

    value_bits: bits per stored weight value. scale_bits: scale (and zero-point) storage per
    weight value. math: which peak of the target runs the matmul ("fp32", "bf16", "fp8",
    "int8", "fp4"); weight-only formats dequantize and run at the activation dtype.
    act_bytes: bytes per activation element read by the matmul.
    group: elements sharing one scale (0 = per output channel).
    act_group: activation elements (along K) sharing one dynamic int8 scale, for the
        block-quantized-activation formats; 0 = per token (W8A8) or no activation quantization.
    block_rows: output rows sharing one weight scale with the ``group`` inputs (a 2-D
        block: 128 for DeepSeek-V3's 128 x 128 FP8); 0 = each row has its own scales.
    """

    value_bits: int
    scale_bits: float
    math: str
    act_bytes: float
    group: int
    weight_only: bool
    act_group: int = 0
    block_rows: int = 0

    @property
    def weight_bits(self) -> float:
        return self.value_bits + self.scale_bits

    def shape_problem(self, out_features: int, in_features: int) -> str:
        """Why a [out, in] weight cannot be stored in this format's blocks, or "".

        Inputs must fill whole groups (the kernels scale per K-block); a 2-D block format's
        outputs must fill whole blocks too, because a runtime that fuses q/k/v or gate/up
        into one GEMM concatenates their scale tiles (vLLM refuses a partition that is not
        a multiple of block_n).
        """
        if self.group and in_features % self.group:
            return f"{in_features} inputs, not a multiple of its group ({self.group})"
        if self.block_rows and out_features % self.block_rows:
            return f"{out_features} outputs, not a multiple of its block ({self.block_rows})"
        return ""


# ---- how exporters and kernels name a format ----------------------------------------------
@dataclass(frozen=True)
class Refused:
    """An exporter or kernel that cannot hold the format, and the one-line reason why."""

    reason: str


@dataclass(frozen=True)
class CompressedTensorsName:
    """The compressed-tensors QuantizationScheme for a format.

    Either a library ``preset`` (``preset_name_to_scheme``) or ``QuantizationArgs`` keyword
    arguments for the weights (and inputs). Neither: the layer stays in the checkpoint's
    16-bit dtype (listed in ``ignore``).
    """

    preset: str | None = None
    weights: Mapping[str, Any] | None = None
    input_activations: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ModelOptName:
    """The ModelOpt ``quant_algo`` of a layer; None: excluded (kept in the model dtype)."""

    quant_algo: str | None


@dataclass(frozen=True)
class OrtNode:
    """The ONNX Runtime (CPU) node computing a layer in this format.

    MatMul: fp32 weights. MatMulInteger: int8 W8A8 through DynamicQuantizeLinear (fused to
    DynamicQuantizeMatMul). MatMulNBits: ``bits``-bit block weights of ``block`` values along
    K, at ``accuracy_level`` (0: fp32 math on dequantized weights; 4: activations rounded
    to int8 per block), with packed per-block ``zero_points`` or the op's default
    2**(bits-1).
    """

    op: Literal["MatMul", "MatMulInteger", "MatMulNBits"]
    bits: int = 0
    block: int = 0
    accuracy_level: int = 0
    zero_points: bool = False


EXPORTERS = ("compressed-tensors", "modelopt", "onnx")


@dataclass(frozen=True)
class FormatSpec:
    """One number format: its facts, its numerics and its names.

    Attributes:
        precision: the Precision this spec defines.
        info: storage and compute facts for the cost model.
        weight: ``(weight dtype, per_channel) -> Scheme`` rounding weights (RTN and GPTQ).
        activation: ``(static scale or None) -> Scheme`` fake-quantizing layer inputs.
        compressed_tensors: the compressed-tensors scheme, or Refused.
        modelopt: the ModelOpt quant_algo, or Refused.
        onnx: the ONNX Runtime node, or Refused.
        kernels: microbenchmark kernel (backends/microbench.py) per sparsity token
            ("dense", "2:4", "block"); a token not listed has no kernel.
        other: further exporters by name (e.g. "gguf": the GGUF tensor type); an exporter
            not listed refuses the format.
        float_dtype: the torch dtype an unquantized format's weights and inputs are held in
            (fp32, bf16, fp16: what a kernel casts to); None for quantized formats.
        input_calibration: ``amax -> parameter``: the static input parameter an exported
            checkpoint stores, from the largest |input| a layer sees on the calibration set
            (FP32 [1]); NVFP4's is its input global scale. None: inputs need no calibration.
        summary: one line for docs and errors.
    """

    precision: Precision
    info: PrecisionInfo
    weight: Callable[[torch.dtype, bool], Scheme]
    activation: Callable[[Tensor | None], Scheme]
    compressed_tensors: CompressedTensorsName | Refused
    modelopt: ModelOptName | Refused
    onnx: OrtNode | Refused
    kernels: Mapping[str, str] = field(default_factory=dict)
    other: Mapping[str, Any] = field(default_factory=dict)
    float_dtype: torch.dtype | None = None
    input_calibration: Callable[[Tensor], Tensor] | None = None
    summary: str = ""

    @property
    def name(self) -> str:
        return self.precision.value

    @property
    def quantized(self) -> bool:
        """Stored as codes plus scales (below 16 bits), not as plain floats."""
        return self.info.value_bits < 16

    def weight_scheme(self, dtype: torch.dtype, *, per_channel: bool = True) -> Scheme:
        """The scheme storing weights of ``dtype`` in this format."""
        return self.weight(dtype, per_channel)

    def activation_scheme(self, static_scale: Tensor | None = None) -> Scheme:
        """The scheme fake-quantizing this format's layer inputs, one row per token."""
        return self.activation(static_scale)

    def naming(self, exporter: str) -> Any:
        """How ``exporter`` names this format (a Refused when it cannot hold it)."""
        core = {"compressed-tensors": self.compressed_tensors, "modelopt": self.modelopt,
                "onnx": self.onnx}
        if exporter in core:
            return core[exporter]
        return self.other.get(exporter, Refused(f"the {exporter} exporter has no name for "
                                                f"{self.name}"))

    def exported_as(self, exporter: str) -> Any:
        """The exporter's name for this format.

        Raises:
            UnsupportedFormatError: the exporter refuses the format; the message says why.
        """
        named = self.naming(exporter)
        if isinstance(named, Refused):
            raise UnsupportedFormatError(f"{exporter} cannot store {self.name} layers: "
                                         f"{named.reason}")
        return named


_FORMATS: Registry[FormatSpec] = Registry(
    "format", "each Precision has exactly one FormatSpec (edit the existing one)")


def register_format(spec: FormatSpec) -> FormatSpec:
    """Add ``spec`` to the registry; returns it (usable as ``SPEC = register_format(...)``).

    Raises:
        AutoplanError: the precision already has a spec (one format, one definition).
    """
    return _FORMATS.register(spec.precision.value, spec)


def _load_builtin() -> None:
    """Register the built-in specs on first use. They import torch (their schemes and
    dtypes), which reading a format's name or answering a CLI usage error must not pay for
    (2-5 s), so the package does not import them up front."""
    import autoplan.formats.builtin  # noqa: F401 - registers on import


def format_spec(precision: Precision | str) -> FormatSpec:
    """The FormatSpec of a precision (a Precision or its text).

    Raises:
        UnknownNameError: no spec is registered under that name; lists every registered one.
    """
    _load_builtin()
    key = precision if isinstance(precision, Precision) else None
    if key is None:
        try:
            key = Precision.parse(precision)
        except UnknownNameError:
            key = None
    if key is None or key.value not in _FORMATS:
        raise UnknownNameError("format", str(getattr(precision, "value", precision)),
                               _FORMATS.names())
    return _FORMATS.get(key.value)


def registered_formats() -> tuple[FormatSpec, ...]:
    """Every registered FormatSpec, in Precision order."""
    _load_builtin()
    order = {p: i for i, p in enumerate(Precision)}
    return tuple(sorted(_FORMATS.values(), key=lambda s: order[s.precision]))


__all__ = [
    "EXPORTERS",
    "CompressedTensorsName",
    "FormatSpec",
    "ModelOptName",
    "OrtNode",
    "Precision",
    "PrecisionInfo",
    "Refused",
    "format_spec",
    "register_format",
    "registered_formats",
]
