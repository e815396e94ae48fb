"""The search-space vocabulary: a layer's Choice is a (Sparsity, Precision) pair.

Canonical text forms (used in search spaces, plans and the CLI):
    precision:  fp32 bf16 fp16 fp8_e4m3 fp8_e5m2 int8 int8_wo int4_g32 int4_g64 int4_g128 nvfp4 mxfp4
                int4a8_g32 int4a8_g64 int4a8_g128 int8a8_g128   (ONNX Runtime's int8-compute formats)
                q8_0 q4_0 q4_1 q5_0 q5_1   (llama.cpp's GGUF block types, autoplan/quant/gguf_blocks.py)
    sparsity:   dense | 2:4 (any N:M) | unstructured@50 | block32@50 | channel@25   (@ = percent zeroed)
    choice:     "2:4+fp8_e4m3"  (also accepted: "2:4 × fp8_e4m3", "2:4 x fp8_e4m3")
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from autoplan.errors import UnknownNameError, UserInputError


class Precision(str, Enum):
    """Number formats. W8A8 formats quantize activations too; *_wo and int4_g* are weight-only."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8_E4M3 = "fp8_e4m3"  # W8A8 FP8, per-channel weight scales, dynamic per-token activations
    FP8_E5M2 = "fp8_e5m2"
    INT8 = "int8"  # W8A8 INT8, per-channel symmetric weights, dynamic per-token activations
    INT8_WO = "int8_wo"  # W8A16
    INT4_G32 = "int4_g32"  # W4A16 group-wise
    INT4_G64 = "int4_g64"
    INT4_G128 = "int4_g128"
    NVFP4 = "nvfp4"  # E2M1 values, E4M3 scale per 16, FP32 tensor scale (W4A4)
    MXFP4 = "mxfp4"  # E2M1 values, E8M0 scale per 32 (W4A4)
    # ONNX Runtime MatMulNBits at accuracy_level 4 (MLAS "CompInt8"): the weights of int4_gN
    # (or int8 per channel), and each activation row quantized to int8 per block of N along
    # K at run time (scale amax / 127, symmetric). Per-block scales make the numerics
    # independent of batch and sequence shape, so a simulated plan equals the running one.
    INT4A8_G32 = "int4a8_g32"
    INT4A8_G64 = "int4a8_g64"
    INT4A8_G128 = "int4a8_g128"
    INT8A8_G128 = "int8a8_g128"
    # llama.cpp's GGUF block types (blocks of 32 along K, fp16 scale, *_1 also an fp16 min),
    # with activations quantized per block of 32 to Q8_0 (Q8_1 for the *_1 types) as
    # llama.cpp's CPU matmul does: autoplan/quant/gguf_blocks.py.
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"
    Q5_0 = "q5_0"
    Q5_1 = "q5_1"

    @classmethod
    def parse(cls, text: str) -> Precision:
        key = text.strip().lower().replace("-", "_")
        key = {"fp8": "fp8_e4m3", "int4": "int4_g128", "w8a16": "int8_wo", "w8a8": "int8"}.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise UnknownNameError("precision", text, [p.value for p in cls]) from None

    @property
    def info(self) -> PrecisionInfo:
        return _PRECISION_INFO[self]


@dataclass(frozen=True)
class PrecisionInfo:
    """How a precision is stored and computed.

    value_bits: bits per stored weight value. scale_bits: scale storage per weight value.
    math: which peak of the target runs the matmul ("fp32", "bf16", "fp8", "int8", "fp4");
    weight-only formats dequantize and run at the activation dtype.
    act_bytes: bytes per activation element read by the matmul.
    group: elements sharing one scale (0 = per output channel).
    act_group: activation elements (along K) sharing one dynamic int8 scale, for the
        block-quantized-activation formats; 0 = per token (W8A8) or no activation quantization.
    """

    value_bits: int
    scale_bits: float
    math: str
    act_bytes: float
    group: int
    weight_only: bool
    act_group: int = 0

    @property
    def weight_bits(self) -> float:
        return self.value_bits + self.scale_bits


_PRECISION_INFO: dict[Precision, PrecisionInfo] = {
    Precision.FP32: PrecisionInfo(32, 0.0, "fp32", 4, 0, False),
    Precision.BF16: PrecisionInfo(16, 0.0, "bf16", 2, 0, False),
    Precision.FP16: PrecisionInfo(16, 0.0, "bf16", 2, 0, False),
    Precision.FP8_E4M3: PrecisionInfo(8, 0.0, "fp8", 1, 0, False),
    Precision.FP8_E5M2: PrecisionInfo(8, 0.0, "fp8", 1, 0, False),
    Precision.INT8: PrecisionInfo(8, 0.0, "int8", 1, 0, False),
    Precision.INT8_WO: PrecisionInfo(8, 0.0, "bf16", 2, 0, True),
    # one FP16 scale per group (hw-facts §3.6: int4 g128 = 4.125 bits/weight)
    Precision.INT4_G32: PrecisionInfo(4, 16 / 32, "bf16", 2, 32, True),
    Precision.INT4_G64: PrecisionInfo(4, 16 / 64, "bf16", 2, 64, True),
    Precision.INT4_G128: PrecisionInfo(4, 16 / 128, "bf16", 2, 128, True),
    Precision.NVFP4: PrecisionInfo(4, 8 / 16, "fp4", 0.5625, 16, False),
    Precision.MXFP4: PrecisionInfo(4, 8 / 32, "fp4", 0.53125, 32, False),
    # ONNX Runtime formats: an fp32 model's MatMulNBits scales are fp32, one per block (the
    # int8 channel scale repeated per 128-block)
    Precision.INT4A8_G32: PrecisionInfo(4, 32 / 32, "int8", 1, 32, False, act_group=32),
    Precision.INT4A8_G64: PrecisionInfo(4, 32 / 64, "int8", 1, 64, False, act_group=64),
    Precision.INT4A8_G128: PrecisionInfo(4, 32 / 128, "int8", 1, 128, False, act_group=128),
    Precision.INT8A8_G128: PrecisionInfo(8, 32 / 128, "int8", 1, 0, False, act_group=128),
    # GGUF: bits from the block sizes (Q4_1: 20 bytes per 32 weights = 5.0 bits); activations
    # read as Q8_0 (34 bytes per 32) or Q8_1 (36 bytes per 32) blocks; int8 dot products.
    Precision.Q8_0: PrecisionInfo(8, 16 / 32, "int8", 34 / 32, 32, False, act_group=32),
    Precision.Q4_0: PrecisionInfo(4, 16 / 32, "int8", 34 / 32, 32, False, act_group=32),
    Precision.Q4_1: PrecisionInfo(4, 32 / 32, "int8", 36 / 32, 32, False, act_group=32),
    Precision.Q5_0: PrecisionInfo(5, 16 / 32, "int8", 34 / 32, 32, False, act_group=32),
    Precision.Q5_1: PrecisionInfo(5, 32 / 32, "int8", 36 / 32, 32, False, act_group=32),
}

_SPARSITY_RE = re.compile(
    r"^(?:(?P<dense>dense)"
    r"|(?P<n>\d+):(?P<m>\d+)"
    r"|(?P<kind>unstructured|block(?P<block>\d+)|channel)@(?P<pct>\d+(?:\.\d+)?)%?)$"
)


@dataclass(frozen=True, order=True)
class Sparsity:
    """A pruning pattern. `ratio` is the fraction of weights removed (0..1)."""

    kind: str = "dense"  # dense | nm | unstructured | block | channel
    n: int = 0
    m: int = 0
    block: int = 0
    ratio: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Sparsity:
        t = text.strip().lower().replace(" ", "")
        match = _SPARSITY_RE.match(t)
        if not match:
            raise UserInputError(
                f"cannot read sparsity '{text}': use dense, N:M (e.g. 2:4), unstructured@50, "
                "block32@50 or channel@25 (@ = percent of weights removed)"
            )
        if match["dense"]:
            return cls()
        if match["n"]:
            n, m = int(match["n"]), int(match["m"])
            if not 0 < n < m:
                raise UserInputError(f"N:M sparsity needs 0 < N < M, got '{text}'")
            return cls("nm", n=n, m=m, ratio=1 - n / m)
        ratio = float(match["pct"]) / 100
        if not 0 < ratio < 1:
            raise UserInputError(f"sparsity ratio must be between 0 and 100 percent, got '{text}'")
        if match["block"]:
            block = int(match["block"])
            if block not in (16, 32, 64):
                raise UserInputError(f"block size must be 16, 32 or 64, got {block}")
            return cls("block", block=block, ratio=ratio)
        return cls(match["kind"], ratio=ratio)

    def __str__(self) -> str:
        pct = f"{self.ratio * 100:g}"
        return {
            "dense": "dense",
            "nm": f"{self.n}:{self.m}",
            "unstructured": f"unstructured@{pct}",
            "block": f"block{self.block}@{pct}",
            "channel": f"channel@{pct}",
        }[self.kind]

    @property
    def density(self) -> float:
        """Fraction of the original weights that remain."""
        return 1.0 - self.ratio

    @property
    def index_bits_per_weight(self) -> float:
        """Index metadata per *original* weight position in the accelerated storage format.

        N:M keeps ceil(log2 M) bits per kept value (2:4 -> two 2-bit indices per 4 weights,
        hw-facts §3.6); block-sparse (BSR) keeps one int32 column index per kept block; an
        unstructured mask costs one bit per weight (bitmask); channel pruning shrinks the
        layer and needs no index.
        """
        if self.kind == "nm":
            return self.density * math.ceil(math.log2(self.m))
        if self.kind == "block":
            return self.density * 32 / (self.block * self.block)
        if self.kind == "unstructured":
            return 1.0
        return 0.0


DENSE = Sparsity()


@dataclass(frozen=True, order=True)
class Choice:
    """One layer's decision: sparsity pattern x precision."""

    sparsity: Sparsity
    precision: Precision

    @classmethod
    def parse(cls, text: str) -> Choice:
        parts = re.split(r"\s*(?:\+|×|\s[xX]\s)\s*", text.strip())
        if len(parts) == 1:
            return cls(DENSE, Precision.parse(parts[0]))
        if len(parts) != 2:
            raise UserInputError(
                f"cannot read choice '{text}': write SPARSITY+PRECISION, e.g. 2:4+fp8_e4m3"
            )
        return cls(Sparsity.parse(parts[0]), Precision.parse(parts[1]))

    def __str__(self) -> str:
        return f"{self.sparsity}+{self.precision.value}"

    def bits_per_weight(self) -> float:
        """Stored bits per original weight, counting scales and sparse index metadata."""
        return self.sparsity.density * self.precision.info.weight_bits + (
            self.sparsity.index_bits_per_weight
        )


__all__ = ["Choice", "DENSE", "Precision", "PrecisionInfo", "Sparsity"]
