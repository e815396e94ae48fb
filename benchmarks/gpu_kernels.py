"""INT8 W8A8 and INT4 W4A16 GEMM kernels that torch itself ships, for the GPU check's sweep.

autoplan's NVIDIA backend names no dense INT8 or W4A16 kernel (backends/nvidia/kernels.py),
but torch has one of each on CUDA; timing them gives the cost model's int8 and int4 classes
a measurement. Both run autoplan.quant's weights, so the numerics are the simulated ones:

- dense+int8: `torch._int_mm` (cuBLASLt int8 x int8 -> int32) on per-token int8 inputs
  (quantize_activation_codes) and per-channel int8 weights, scaled in fp32 after. cuBLASLt
  wants M > 16, so smaller M is zero-padded to 32 rows (the row's kernel name says so).
- dense+int4_gG: `torch._weight_int4pack_mm` (the tinygemm W4A16 kernel, SM80+): codes
  c in -8..7 go in as c + 8 with zero 0 (its dequant is (q - 8) * scale + zero), scales per
  group in bf16 (autoplan keeps fp16-exact ones: a 2^-9 relative rounding of the scale).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autoplan.formats import Choice, Precision
from autoplan.quant import QuantizedWeight, quantize_activation_codes, quantize_weight

INT_MM_MIN_M = 17  # cuBLASLt's int8 GEMM refuses M <= 16
INNER_K_TILES = 8

Layer = Callable[[torch.Tensor], torch.Tensor]


def int8_linear_from(q: QuantizedWeight) -> tuple[Layer, str]:
    """x [M, K] -> bf16 [M, N] through torch._int_mm on the int8 QuantizedWeight `q`."""
    w = q.codes.contiguous()  # [N, K] row-major: mat2 = w.T is column-major, cuBLASLt's TN
    w_scale = q.scales["weight_scale"].reshape(1, -1).float()

    def call(x: torch.Tensor) -> torch.Tensor:
        codes, params, _ = quantize_activation_codes(x.float(), Precision.INT8)
        m = codes.shape[0]
        if m < INT_MM_MIN_M:
            codes = torch.nn.functional.pad(codes, (0, 0, 0, 32 - m))
        acc = torch._int_mm(codes, w.t())[:m]
        return (acc.float() * params.scale.reshape(-1, 1).float() * w_scale).to(torch.bfloat16)

    return call, "torch._int_mm"


def int4_linear_from(q: QuantizedWeight, group: int) -> tuple[Layer, str]:
    """x [M, K] -> bf16 [M, N] through torch._weight_int4pack_mm on an int4_gG weight."""
    n, k = q.codes.shape
    unsigned = (q.codes.to(torch.int32) + 8).to(torch.uint8)  # 0..15
    packed_u8 = (unsigned[:, ::2] << 4 | unsigned[:, 1::2]).contiguous()  # [N, K/2]
    packed = torch._convert_weight_to_int4pack(packed_u8, INNER_K_TILES)
    scale = q.scales["weight_scale"].reshape(n, k // group).to(torch.bfloat16)
    scales_zeros = torch.stack([scale.t(), torch.zeros_like(scale.t())], dim=-1).contiguous()

    def call(x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm(x.to(torch.bfloat16).contiguous(), packed, group,
                                         scales_zeros)

    return call, "torch._weight_int4pack_mm"


def build(choice: Choice, w: torch.Tensor) -> tuple[Layer, str]:
    """The layer for `choice` (dense int8, or dense int4_gG) on weight `w` [N, K].

    Raises:
        ValueError: the choice is neither (the caller times it through autoplan's kernels).
    """
    if choice.sparsity.kind != "dense":
        raise ValueError(f"{choice}: only dense int8 / int4_gG run through torch's own kernels")
    if choice.precision is Precision.INT8:
        return int8_linear_from(quantize_weight(w.float(), Precision.INT8))
    name = choice.precision.value
    if name.startswith("int4_g"):
        return int4_linear_from(quantize_weight(w.float(), choice.precision), int(name[6:]))
    raise ValueError(f"{choice}: only dense int8 / int4_gG run through torch's own kernels")


def kernel_name(choice: Choice) -> str:
    """The torch kernel `build` times for a choice it handles."""
    return "torch._int_mm" if choice.precision is Precision.INT8 else "torch._weight_int4pack_mm"


def handles(choice: Choice) -> bool:
    """Whether `build` takes this choice."""
    name = choice.precision.value
    return choice.sparsity.kind == "dense" and (name == "int8" or name.startswith("int4_g"))


__all__ = ["build", "handles", "int4_linear_from", "int8_linear_from", "kernel_name"]
