"""Bit-exact simulation of inference number formats (FP8, INT8, INT4, NVFP4, MXFP4) on CPU.

Reasoning and sources: docs/modules.md.
"""

from autoplan.quant.activations import (
    activation_scheme,
    quantize_activation,
    quantize_activation_codes,
)
from autoplan.formats.elements import (
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    E5M2_MAX,
    cast_e2m1,
    cast_fp8_e4m3,
    cast_fp8_e5m2,
    decode_e2m1,
    decode_e8m0,
    encode_e2m1,
    encode_e8m0,
    mx_shared_exponent,
    round_to_bf16,
    round_to_fp16,
)
from autoplan.quant.gptq import gptq_quantize
from autoplan.calib_stats import HessianAccumulator, hessian_from_inputs, inverse_hessian_cholesky
from autoplan.formats.schemes import nvfp4_global_scale
from autoplan.quant.simulated_linear import SimulatedLinear
from autoplan.quant.methods import QuantMethod
from autoplan.quant.weights import QuantizedWeight, quantize_weight, weight_scheme

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E5M2_MAX",
    "HessianAccumulator",
    "QuantMethod",
    "QuantizedWeight",
    "SimulatedLinear",
    "activation_scheme",
    "cast_e2m1",
    "cast_fp8_e4m3",
    "cast_fp8_e5m2",
    "decode_e2m1",
    "decode_e8m0",
    "encode_e2m1",
    "encode_e8m0",
    "gptq_quantize",
    "hessian_from_inputs",
    "inverse_hessian_cholesky",
    "mx_shared_exponent",
    "nvfp4_global_scale",
    "quantize_activation",
    "quantize_activation_codes",
    "quantize_weight",
    "round_to_bf16",
    "round_to_fp16",
    "weight_scheme",
]
