"""A number format defined outside autoplan's core: compressed-tensors' W8A16 preset.

INT8 weights per group of 128 along the input dimension (symmetric, codes -128..127, scale
amax / 127.5 in the model's 16-bit dtype: compressed-tensors' ``calculate_qparams`` rule),
16-bit inputs. Importing this module defines the precision and registers its FormatSpec, as a
torchao config registers its handler; a package makes it load with autoplan by declaring it
in the ``autoplan.formats`` entry-point group::

    [project.entry-points."autoplan.formats"]
    int8_g128 = "int8_g128"
"""

from __future__ import annotations

import torch

from autoplan.formats import (
    CompressedTensorsName,
    FormatSpec,
    Precision,
    PrecisionInfo,
    Refused,
    register_format,
)
from autoplan.formats.schemes import IntScheme, RoundScheme, scale_dtype_for

GROUP = 128
INT8_G128 = Precision.define("int8_g128")


def _weights(dtype: torch.dtype, per_channel: bool) -> IntScheme:
    return IntScheme(-128, 127, 127.5, group=GROUP, scale_dtype=scale_dtype_for(dtype))


def _inputs(static_scale: torch.Tensor | None = None) -> RoundScheme:
    return RoundScheme(None)  # weight-only: inputs stay 16-bit


SPEC = register_format(FormatSpec(
    INT8_G128,
    # 8-bit codes plus one 16-bit scale per 128 weights; dequantized, the GEMM runs in bf16
    PrecisionInfo(8, 16 / GROUP, "bf16", 2, GROUP, True),
    weight=_weights, activation=_inputs,
    compressed_tensors=CompressedTensorsName(preset="W8A16"),
    modelopt=Refused("ModelOpt's W8A16 is per channel: plan int8_wo for TensorRT-LLM"),
    onnx=Refused("the ONNX (CPU) export holds MatMulNBits int8 per its own block: plan int8_wo"),
    summary="INT8 weights per group of 128 (symmetric, codes -128..127), 16-bit inputs "
            "(compressed-tensors W8A16)",
))
