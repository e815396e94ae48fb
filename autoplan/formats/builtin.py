"""The built-in FormatSpecs: every format autoplan simulates, with its engines' names for it.

Each spec says how the format is stored (PrecisionInfo, for the cost model: the torch-free
table of autoplan/formats/info.py), how weights and inputs round (scheme factories from
autoplan.formats.schemes), and what compressed-tensors, ModelOpt, ONNX Runtime and the
microbenchmark kernels call it -- or a one-line reason why they cannot hold it. Group-wise
families (int4_gN, uint4_gN, ...) are built by one function per family so their three group
sizes cannot drift apart.
"""

from __future__ import annotations

import torch
from torch import Tensor

from autoplan.formats.elements import round_to_bf16, round_to_fp16
from autoplan.formats.gguf_blocks import (GGUF, MXFP4, BlockFormat, GgufActScheme,
                                          GgufMxFp4Scheme, GgufWeightScheme)
from autoplan.formats.info import BUILTIN_INFO, GROUPS
from autoplan.formats.registry import (
    CompressedTensorsName,
    FormatSpec,
    ModelOptName,
    OrtNode,
    Precision,
    PrecisionInfo,
    Refused,
    register_format,
)
from autoplan.formats.schemes import (
    FP8_ACT_MIN_SCALE,
    AsymIntScheme,
    BlockInt8ActScheme,
    Fp8BlockScheme,
    Fp8Scheme,
    Fp8TokenGroupActScheme,
    IntScheme,
    MxFp4Scheme,
    NvFp4Scheme,
    RoundScheme,
    TokenInt8ActScheme,
    nvfp4_global_scale,
    scale_dtype_for,
)


def _info(precision: Precision) -> PrecisionInfo:
    """How the format is stored and computed: the torch-free table's entry (its one place)."""
    return BUILTIN_INFO[precision.value]


INT8_NBITS_BLOCK = 128  # MatMulNBits block of 8-bit layers; each block repeats the channel scale

# ---- shared pieces -----------------------------------------------------------------------
_KEEP_CT = CompressedTensorsName()  # stays in the checkpoint's 16-bit dtype (`ignore`)
_KEEP_MO = ModelOptName(None)  # excluded: weight in the model dtype
_MO_ONLY = "the modelopt exporter writes fp8_e4m3, int8_wo and 16-bit layers; export with " \
           "--format compressed-tensors or re-plan"
_ORT_ONLY = "the ONNX (CPU) export holds fp32, int8 and MatMulNBits int4/int8 layers; " \
            "re-plan for a CPU target"
_A8_CT = "its int8 activations per K-block are ONNX Runtime MatMulNBits rounding, which no " \
         "compressed-tensors scheme describes; plan int4_gN/uint4_gN for vLLM"
_GGUF_ONLY = "a llama.cpp GGUF block type (with Q8_0/Q8_1 activations): export it with " \
             "--format gguf"


def _passthrough(static_scale: Tensor | None = None) -> RoundScheme:
    return RoundScheme(None)  # fp32 and weight-only formats leave inputs alone


def _int8_weights(dtype: torch.dtype, per_channel: bool) -> IntScheme:
    return IntScheme(-127, 127, 127.0, per_tensor=not per_channel,
                     scale_dtype=scale_dtype_for(dtype))


def _int4_weights(group: int):  # noqa: ANN202 - a scheme factory
    return lambda dtype, per_channel: IntScheme(-8, 7, 7.5, group=group,
                                                scale_dtype=scale_dtype_for(dtype))


def _uint4_weights(group: int):  # noqa: ANN202 - a scheme factory
    return lambda dtype, per_channel: AsymIntScheme(4, group, scale_dtype=scale_dtype_for(dtype))


def _block_int8_inputs(group: int):  # noqa: ANN202 - a scheme factory
    return lambda static_scale=None: BlockInt8ActScheme(group)


# ---- floats ------------------------------------------------------------------------------
register_format(FormatSpec(
    Precision.FP32, _info(Precision.FP32),
    weight=lambda dtype, per_channel: RoundScheme(None), activation=_passthrough,
    compressed_tensors=_KEEP_CT, modelopt=_KEEP_MO, onnx=OrtNode("MatMul"),
    kernels={"dense": "torch.linear", "block": "triton_bsr"}, other={GGUF: "F32"},
    float_dtype=torch.float32, summary="IEEE fp32, unquantized",
))
for _p, _round, _gguf, _dtype in ((Precision.BF16, round_to_bf16, "BF16", torch.bfloat16),
                                  (Precision.FP16, round_to_fp16, "F16", torch.float16)):
    register_format(FormatSpec(
        _p, _info(_p),
        weight=lambda dtype, per_channel, r=_round: RoundScheme(r),
        activation=lambda static_scale=None, r=_round: RoundScheme(r),
        compressed_tensors=_KEEP_CT, modelopt=_KEEP_MO,
        onnx=Refused(f"the CPU export runs fp32 activations; ONNX Runtime has no {_p.value} "
                     "CPU GEMM here; use fp32 or a quantized CPU format"),
        kernels={"dense": "torch.linear", "2:4": "semi_structured", "block": "triton_bsr"},
        other={GGUF: _gguf}, float_dtype=_dtype,
        summary=f"{_p.value} weights and activations, unquantized",
    ))

# ---- FP8 (W8A8) --------------------------------------------------------------------------
register_format(FormatSpec(
    Precision.FP8_E4M3, _info(Precision.FP8_E4M3),
    weight=lambda dtype, per_channel: Fp8Scheme(e4m3=True, per_tensor=not per_channel),
    activation=lambda static_scale=None: Fp8Scheme(e4m3=True, min_scale=FP8_ACT_MIN_SCALE),
    compressed_tensors=CompressedTensorsName(preset="FP8_DYNAMIC"),
    modelopt=ModelOptName("FP8_PER_CHANNEL_PER_TOKEN"), onnx=Refused(_ORT_ONLY),
    kernels={"dense": "torch._scaled_mm", "2:4": "cusparselt", "block": "triton_bsr"},
    summary="FP8 E4M3 weights per channel, dynamic per-token FP8 inputs",
))
register_format(FormatSpec(
    Precision.FP8_E5M2, _info(Precision.FP8_E5M2),
    weight=lambda dtype, per_channel: Fp8Scheme(e4m3=False, per_tensor=not per_channel),
    activation=lambda static_scale=None: Fp8Scheme(e4m3=False, min_scale=FP8_ACT_MIN_SCALE),
    compressed_tensors=Refused("compressed-tensors' FP8 presets store E4M3 weights, not E5M2; "
                               "plan fp8_e4m3"),
    modelopt=Refused(_MO_ONLY), onnx=Refused(_ORT_ONLY),
    summary="FP8 E5M2 weights per channel, dynamic per-token FP8 inputs",
))

# DeepSeek-V3-style block FP8 (W8A8): an FP32 scale per 128 x 128 weight block (32 bits per
# 16384 weights), E4M3 inputs with an FP32 scale per token per 128 (1 + 4/128 bytes each) made
# by a separate quantization kernel before the GEMM.
register_format(FormatSpec(
    Precision.FP8_B128,
    _info(Precision.FP8_B128),
    weight=lambda dtype, per_channel: Fp8BlockScheme(128, 128),
    activation=lambda static_scale=None: Fp8TokenGroupActScheme(128),
    compressed_tensors=CompressedTensorsName(preset="FP8_BLOCK"),
    modelopt=Refused("TensorRT-LLM runs block FP8 as FP8_BLOCK_SCALES, whose per-128 input "
                     "rounding autoplan has not checked against its simulation; export with "
                     "--format compressed-tensors for vLLM"),
    onnx=Refused(_ORT_ONLY),
    summary="FP8 E4M3 weights with an FP32 scale per 128x128 block, dynamic FP8 inputs per "
            "token per 128 (DeepSeek-V3 block FP8)",
))

# ---- INT8 ----------------------------------------------------------------------------------
register_format(FormatSpec(
    Precision.INT8, _info(Precision.INT8),
    weight=_int8_weights,
    # Dynamic: vLLM's per-token kernel, x * (127 / amax). Static: its x / scale kernel,
    # codes clamped to the full int8 range.
    activation=lambda static_scale=None: (TokenInt8ActScheme() if static_scale is None
                                          else IntScheme(-128, 127, 127.0)),
    compressed_tensors=CompressedTensorsName(preset="W8A8"), modelopt=Refused(_MO_ONLY),
    onnx=OrtNode("MatMulInteger"), kernels={"block": "triton_bsr"},
    summary="INT8 weights per channel (symmetric), dynamic per-token INT8 inputs",
))
register_format(FormatSpec(
    Precision.INT8_WO, _info(Precision.INT8_WO),
    weight=_int8_weights, activation=_passthrough,
    # The library's W8A16 preset is group-128; autoplan's int8_wo is per channel.
    compressed_tensors=CompressedTensorsName(weights=dict(
        num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False)),
    modelopt=ModelOptName("W8A16"), onnx=OrtNode("MatMulNBits", 8, INT8_NBITS_BLOCK, 0),
    summary="INT8 weights per channel, 16-bit inputs (W8A16)",
))
register_format(FormatSpec(
    Precision.INT8A8_G128, _info(Precision.INT8A8_G128),
    weight=_int8_weights, activation=_block_int8_inputs(128),
    compressed_tensors=Refused(_A8_CT), modelopt=Refused(_MO_ONLY),
    onnx=OrtNode("MatMulNBits", 8, INT8_NBITS_BLOCK, 4),
    summary="INT8 weights per channel x int8 inputs per block of 128 (MatMulNBits level 4)",
))


# ---- group-wise INT4 families --------------------------------------------------------------
def _register_int4_family(group: int) -> None:
    """int4_gN / uint4_gN (W4A16, ONNX level 0) and int4a8_gN / uint4a8_gN (level 4).

    Their bits and scales per weight: autoplan/formats/info.py.
    """
    by_name = Precision.parse
    for signed in (True, False):
        prefix = "int4" if signed else "uint4"
        weights = _int4_weights(group) if signed else _uint4_weights(group)
        kind = "symmetric, codes -8..7" if signed else "asymmetric, codes 0..15 + zero point"
        register_format(FormatSpec(
            by_name(f"{prefix}_g{group}"), _info(by_name(f"{prefix}_g{group}")),
            weight=weights, activation=_passthrough,
            compressed_tensors=CompressedTensorsName(weights=dict(
                num_bits=4, type="int", strategy="group", symmetric=signed, dynamic=False,
                group_size=group)),
            modelopt=Refused(_MO_ONLY),
            onnx=OrtNode("MatMulNBits", 4, group, 0, zero_points=not signed),
            summary=f"INT4 weights per group of {group} ({kind}), 16-bit inputs (W4A16)",
        ))
        register_format(FormatSpec(
            by_name(f"{prefix}a8_g{group}"), _info(by_name(f"{prefix}a8_g{group}")),
            weight=weights, activation=_block_int8_inputs(group),
            compressed_tensors=Refused(_A8_CT), modelopt=Refused(_MO_ONLY),
            onnx=OrtNode("MatMulNBits", 4, group, 4, zero_points=not signed),
            summary=f"INT4 weights per group of {group} ({kind}) x int8 inputs per block of "
                    f"{group} (MatMulNBits level 4)",
        ))


for _group in GROUPS:
    _register_int4_family(_group)

# ---- FP4 (W4A4) ----------------------------------------------------------------------------
register_format(FormatSpec(
    Precision.NVFP4, _info(Precision.NVFP4),
    weight=lambda dtype, per_channel: NvFp4Scheme(zero_scale=0.125),
    activation=lambda static_scale=None: NvFp4Scheme(static_scale),
    compressed_tensors=CompressedTensorsName(preset="NVFP4"), modelopt=Refused(_MO_ONLY),
    onnx=Refused(_ORT_ONLY), kernels={"dense": "torch._scaled_mm_fp4"},
    input_calibration=nvfp4_global_scale,  # the checkpoint's static input_global_scale
    summary="E2M1 values, E4M3 scale per 16, FP32 tensor scale; inputs likewise",
))
register_format(FormatSpec(
    Precision.MXFP4, _info(Precision.MXFP4),
    weight=lambda dtype, per_channel: MxFp4Scheme(),
    activation=lambda static_scale=None: MxFp4Scheme(),
    compressed_tensors=CompressedTensorsName(preset="MXFP4"),
    modelopt=Refused(_MO_ONLY), onnx=Refused(_ORT_ONLY),
    summary="E2M1 values, E8M0 scale per 32 (OCP MX); inputs likewise",
))
# The same stored weights with 16-bit inputs: what vLLM runs an MXFP4 checkpoint as below
# Blackwell (Marlin FP4 dequantizes to bf16; gpt-oss's experts on Hopper), so its own format.
register_format(FormatSpec(
    Precision.parse("mxfp4_wo"), _info(Precision.parse("mxfp4_wo")),
    weight=lambda dtype, per_channel: MxFp4Scheme(), activation=_passthrough,
    compressed_tensors=CompressedTensorsName(preset="MXFP4A16"),
    modelopt=Refused(_MO_ONLY), onnx=Refused(_ORT_ONLY),
    summary="E2M1 values, E8M0 scale per 32 (OCP MX), 16-bit inputs (W4A16)",
))

# ---- llama.cpp GGUF block types -------------------------------------------------------------
# Bits, scales and the Q8_0/Q8_1 activation blocks: autoplan/formats/info.py.
for _fmt in (BlockFormat("Q8_0", 8, False, "Q8_0"), BlockFormat("Q4_0", 4, False, "Q8_0"),
             BlockFormat("Q4_1", 4, True, "Q8_1"), BlockFormat("Q5_0", 5, False, "Q8_0"),
             BlockFormat("Q5_1", 5, True, "Q8_1")):
    register_format(FormatSpec(
        Precision.parse(_fmt.ggml_type), _info(Precision.parse(_fmt.ggml_type)),
        weight=lambda dtype, per_channel, f=_fmt: GgufWeightScheme(f),
        activation=lambda static_scale=None: GgufActScheme(),
        compressed_tensors=Refused(_GGUF_ONLY), modelopt=Refused(_GGUF_ONLY),
        onnx=Refused(_GGUF_ONLY), other={GGUF: _fmt},
        summary=f"GGUF {_fmt.ggml_type}: blocks of 32, fp16 scale"
                f"{' and min' if _fmt.has_min else ''}; {_fmt.act_type} activations",
    ))

# ggml's MXFP4 (gpt-oss's experts in GGUF): the stored bytes as ggml quantizes them, inputs
# rounded to Q8_0 as ggml-cpu's ggml_vec_dot_mxfp4_q8_0 reads them (its vec_dot_type). vLLM's
# mxfp4 rounds inputs to MXFP4 instead and picks another exponent, so it is its own format.
register_format(FormatSpec(
    Precision.GGUF_MXFP4, _info(Precision.GGUF_MXFP4),
    weight=lambda dtype, per_channel: GgufMxFp4Scheme(),
    activation=lambda static_scale=None: GgufActScheme(),
    compressed_tensors=Refused(_GGUF_ONLY), modelopt=Refused(_GGUF_ONLY),
    onnx=Refused(_GGUF_ONLY), other={GGUF: MXFP4},
    summary="GGUF MXFP4: E2M1 values, E8M0 scale per 32 (ggml's rounding); Q8_0 activations",
))

__all__ = ["GROUPS", "INT8_NBITS_BLOCK"]
