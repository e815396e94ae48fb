"""Bit-exact simulation of inference number formats (FP8, INT8, INT4, NVFP4, MXFP4) on CPU.

Reasoning and sources: docs/modules.md.
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py)
_EXPORTS = {
    "activation_scheme": "autoplan.quant.activations",
    "quantize_activation": "autoplan.quant.activations",
    "quantize_activation_codes": "autoplan.quant.activations",
    "E2M1_MAX": "autoplan.formats.elements",
    "E2M1_VALUES": "autoplan.formats.elements",
    "E4M3_MAX": "autoplan.formats.elements",
    "E5M2_MAX": "autoplan.formats.elements",
    "cast_e2m1": "autoplan.formats.elements",
    "cast_fp8_e4m3": "autoplan.formats.elements",
    "cast_fp8_e5m2": "autoplan.formats.elements",
    "decode_e2m1": "autoplan.formats.elements",
    "decode_e8m0": "autoplan.formats.elements",
    "encode_e2m1": "autoplan.formats.elements",
    "encode_e8m0": "autoplan.formats.elements",
    "mx_shared_exponent": "autoplan.formats.elements",
    "round_to_bf16": "autoplan.formats.elements",
    "round_to_fp16": "autoplan.formats.elements",
    "gptq_quantize": "autoplan.quant.gptq",
    "HessianAccumulator": "autoplan.calib_stats",
    "hessian_from_inputs": "autoplan.calib_stats",
    "inverse_hessian_cholesky": "autoplan.calib_stats",
    "nvfp4_global_scale": "autoplan.formats.schemes",
    "SimulatedLinear": "autoplan.quant.simulated_linear",
    "QuantMethod": "autoplan.quant.methods",
    "QuantizedWeight": "autoplan.quant.weights",
    "quantize_weight": "autoplan.quant.weights",
    "weight_scheme": "autoplan.quant.weights",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

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
