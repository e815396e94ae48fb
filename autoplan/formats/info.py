"""How each built-in format is stored and computed, without torch.

The built-in FormatSpecs (autoplan/formats/builtin.py) import torch for their schemes and
dtypes; the cost model and the CLI's argument checks only need a format's bits, group and
which peak runs its matmul. Those facts live here, once: builtin.py builds each spec's info
from this table, and tests/unit/test_cli_startup.py checks that every registered built-in
spec carries exactly its entry, so the two cannot drift.
"""

from __future__ import annotations

from autoplan.formats.registry import PrecisionInfo

GROUPS = (32, 64, 128)  # the group sizes of the group-wise INT4 families


def _int4_family() -> dict[str, PrecisionInfo]:
    """int4_gN / uint4_gN (W4A16: an FP16 scale per group, hw-facts §3.6: int4 g128 = 4.125
    bits) and int4a8_gN / uint4a8_gN (an FP32 scale per block in the fp32 ONNX model, int8
    inputs per block); asymmetric formats add one 4-bit zero point per group."""
    out = {}
    for group in GROUPS:
        for prefix, zp_bits in (("int4", 0), ("uint4", 4)):
            out[f"{prefix}_g{group}"] = PrecisionInfo(4, (16 + zp_bits) / group, "bf16", 2,
                                                      group, True)
            out[f"{prefix}a8_g{group}"] = PrecisionInfo(4, (32 + zp_bits) / group, "int8", 1,
                                                        group, False, act_group=group)
    return out


# GGUF block types: bits from the block sizes (Q4_1: 20 bytes per 32 weights = 5.0 bits);
# activations read as Q8_0 (34 bytes per 32) or Q8_1 (36 bytes per 32) blocks; int8 dots.
_GGUF = {name: PrecisionInfo(bits, scale_bits, "int8", act_bytes_per_32 / 32, 32, False,
                             act_group=32)
         for name, bits, scale_bits, act_bytes_per_32 in (("q8_0", 8, 16 / 32, 34),
                                                           ("q4_0", 4, 16 / 32, 34),
                                                           ("q4_1", 4, 32 / 32, 36),
                                                           ("q5_0", 5, 16 / 32, 34),
                                                           ("q5_1", 5, 32 / 32, 36))}

# ggml's MXFP4 (gguf_mxfp4): 17 bytes per 32 weights (an E8M0 byte + 16 bytes of E2M1 pairs)
# = 4.25 bits; Q8_0 activations and int8 dots (the E2M1 codes are looked up as int8), as above.
_GGUF["gguf_mxfp4"] = PrecisionInfo(4, 8 / 32, "int8", 34 / 32, 32, False, act_group=32)

BUILTIN_INFO: dict[str, PrecisionInfo] = {
    "fp32": PrecisionInfo(32, 0.0, "fp32", 4, 0, False),
    "bf16": PrecisionInfo(16, 0.0, "bf16", 2, 0, False),
    "fp16": PrecisionInfo(16, 0.0, "bf16", 2, 0, False),
    "fp8_e4m3": PrecisionInfo(8, 0.0, "fp8", 1, 0, False),
    "fp8_e5m2": PrecisionInfo(8, 0.0, "fp8", 1, 0, False),
    # DeepSeek-V3 block FP8: an FP32 scale per 128 x 128 weight block (32 bits per 16384
    # weights), E4M3 inputs with an FP32 scale per token per 128 (1 + 4/128 bytes each)
    "fp8_b128": PrecisionInfo(8, 32 / (128 * 128), "fp8", 1 + 4 / 128, 128, False,
                              block_rows=128),
    "int8": PrecisionInfo(8, 0.0, "int8", 1, 0, False),
    "int8_wo": PrecisionInfo(8, 0.0, "bf16", 2, 0, True),
    "int8a8_g128": PrecisionInfo(8, 32 / 128, "int8", 1, 0, False, act_group=128),
    **_int4_family(),
    "nvfp4": PrecisionInfo(4, 8 / 16, "fp4", 0.5625, 16, False),
    "mxfp4": PrecisionInfo(4, 8 / 32, "fp4", 0.53125, 32, False),
    "mxfp4_wo": PrecisionInfo(4, 8 / 32, "bf16", 2, 32, True),
    **_GGUF,
}

__all__ = ["BUILTIN_INFO", "GROUPS"]
