"""The format registry: one FormatSpec per Precision, and the names the engines give it.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
import re
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from autoplan.errors import AutoplanError, UnknownNameError, UnsupportedFormatError
from autoplan.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from autoplan.formats.schemes import Scheme


class _Vocabulary(type):
    """Iterating ``Precision`` gives every defined precision, in definition order."""

    def __iter__(cls) -> Iterator[Precision]:
        return iter(list(cls._defined.values()))  # type: ignore[attr-defined]

    def __len__(cls) -> int:
        return len(cls._defined)  # type: ignore[attr-defined]


class Precision(str, metaclass=_Vocabulary):
    """A number format, by its canonical text: an open vocabulary. The built-in formats are
    class attributes (``Precision.NVFP4``); a format of your own is defined where it is
    registered (``Precision.define("int3_g64")`` next to its ``register_format``), so the core
    needs no edit. Each defined precision is one interned object: ``is`` compares them, and
    ``Precision("fp8_e4m3")`` returns the one ``Precision.FP8_E4M3``."""

    _defined: ClassVar[dict[str, Precision]] = {}
    name: str

    def __new__(cls, value: str) -> Precision:
        try:
            return cls._defined[value]
        except KeyError:
            raise ValueError(f"{value!r} is not a defined Precision") from None

    @classmethod
    def define(cls, value: str) -> Precision:
        """Define a new precision named ``value`` (lowercase text) and return it.

        Raises:
            AutoplanError: the name is defined already, or is not lowercase text.
        """
        if value in cls._defined or not re.fullmatch(r"[a-z0-9_]+", value):
            raise AutoplanError(f"precision '{value}' is defined twice or is not lowercase "
                                "[a-z0-9_] text: pick another name")
        obj = str.__new__(cls, value)
        obj.name = value.upper()
        cls._defined[value] = obj
        if not hasattr(cls, obj.name):
            setattr(cls, obj.name, obj)
        return obj

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"Precision.{self.name}"

    def __reduce__(self) -> tuple:
        return (Precision, (self.value,))

    def __copy__(self) -> Precision:
        return self

    def __deepcopy__(self, memo: dict) -> Precision:
        return self

    @classmethod
    def values(cls) -> list[str]:
        """Every defined precision's text, in definition order (click.Choice, messages)."""
        return list(cls._defined)

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
        """How the format is stored and computed (its FormatSpec's info). A built-in
        format's comes from the torch-free table (autoplan/formats/info.py) its spec is built
        from, so reading it does not load the specs (and torch)."""
        if self.value not in _FORMATS:
            from autoplan.formats.info import BUILTIN_INFO

            if self.value in BUILTIN_INFO:
                return BUILTIN_INFO[self.value]
        return format_spec(self).info


# The built-in formats, defined in this order (a module of your own defines more with
# ``Precision.define``, next to the FormatSpec it registers).
for _name in (
    "fp32",
    "bf16",
    "fp16",
    "fp8_e4m3",  # W8A8 FP8, per-channel weight scales, dynamic per-token activations
    "fp8_e5m2",
    "int8",  # W8A8 INT8, per-channel symmetric weights, dynamic per-token activations
    "int8_wo",  # W8A16
    "int4_g32",  # W4A16 group-wise, symmetric
    "int4_g64",
    "int4_g128",
    "uint4_g32",  # W4A16 group-wise, asymmetric (codes 0..15, scale and zero point)
    "uint4_g64",
    "uint4_g128",
    "nvfp4",  # E2M1 values, E4M3 scale per 16, FP32 tensor scale (W4A4)
    "mxfp4",  # E2M1 values, E8M0 scale per 32 (W4A4)
    "mxfp4_wo",  # the same weights with 16-bit inputs (W4A16, Marlin FP4 on sm80-sm90)
    # DeepSeek-V3 block FP8: E4M3 weights with an FP32 scale per 128 x 128 block, E4M3 inputs
    # with a dynamic scale per token per 128 inputs (vLLM's per_token_group_quant_fp8).
    "fp8_b128",
    # ONNX Runtime MatMulNBits at accuracy_level 4: int4/int8 block weights x activations
    # rounded to int8 per block along K at run time (see the FormatSpecs in builtin.py).
    "int4a8_g32",
    "int4a8_g64",
    "int4a8_g128",
    "uint4a8_g32",
    "uint4a8_g64",
    "uint4a8_g128",
    "int8a8_g128",
    # llama.cpp's GGUF block types (blocks of 32 along K, fp16 scale, *_1 also an fp16 min),
    # with activations quantized per block of 32 to Q8_0 (Q8_1 for the *_1 types) as
    # llama.cpp's CPU matmul does: autoplan/formats/gguf_blocks.py.
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    # ggml's MXFP4 type (GGUF MXFP4: E8M0 exponent + 32 E2M1 codes per block, gpt-oss's
    # experts) with Q8_0 activations, as ggml-cpu runs it. Its lowercased ggml name is taken
    # by vLLM's mxfp4 (MXFP4 inputs, another exponent rounding), so it carries the "gguf"
    # prefix autoplan gives a GGUF type by its ggml name (``gguf:Q6_K`` rows).
    "gguf_mxfp4",
):
    Precision.define(_name)


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
