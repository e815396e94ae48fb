"""quantize_activation: fake-quantize a layer input as the serving kernel would, per token.

``quantize_activation_codes`` gives the same rounding as codes plus scales, for the GPU
kernels that feed quantized inputs to a GEMM (so a microbenchmark times the numerics the
simulation measured).
"""

from __future__ import annotations

import torch
from torch import Tensor

from autoplan.errors import UserInputError
from autoplan.formats import Precision, format_spec
from autoplan.formats.schemes import NvFp4Scheme, QParams, RoundScheme, Scheme, quantize_rows


def activation_scheme(precision: Precision, static_scale: Tensor | None = None) -> Scheme:
    """The scheme fake-quantizing inputs of a ``precision`` layer (its FormatSpec's)."""
    return format_spec(precision).activation_scheme(static_scale)


def quantize_activation(
    x: Tensor, precision: Precision, *, static_scale: Tensor | None = None
) -> Tensor:
    """Fake-quantize activations ``x`` [..., in] for a layer stored in ``precision``.

    * fp32 and weight-only formats (int8_wo, int4_g*): unchanged; bf16/fp16: rounded.
    * fp8_e4m3/fp8_e5m2/int8 (W8A8): dynamic per-token scales (amax / fmax, amax / 127),
      or one static per-tensor ``static_scale``.
    * nvfp4: E4M3 scales per 16 values computed on the fly; ``static_scale`` is the
      calibrated FP32 global scale (``448 * 6 / amax``) when given, else one from this
      tensor's amax.
    * mxfp4: E8M0 scales per 32 values on the fly (``static_scale`` is not used).

    Args:
        x: activations, tokens along the leading dims, features last.
        precision: the layer's precision.
        static_scale: see above; a scalar (or one-element) tensor.

    Returns:
        Simulated activations, same shape and dtype as ``x``.
    """
    scheme = activation_scheme(precision, static_scale)
    if isinstance(scheme, RoundScheme):
        return scheme.fake(x, None, None)[0]
    deq, _, _, _ = _quantize_rows_of(x, scheme, static_scale)
    return deq.reshape(x.shape).to(x.dtype)


def quantize_activation_codes(
    x: Tensor, precision: Precision, *, static_scale: Tensor | None = None
) -> tuple[Tensor, QParams, Tensor | None]:
    """The codes and scales ``quantize_activation`` rounds ``x`` [tokens, in] to.

    Returns:
        ``(codes, params, ctx)``: codes in the format's storage (float8 for FP8, int8 for
        INT8, unpacked uint8 E2M1 codes for NVFP4/MXFP4), ``params`` per token (and group)
        in their storage dtypes, and the tensor-level parameter (NVFP4's FP32 global scale).

    Raises:
        UserInputError: ``precision`` does not quantize its inputs (fp32, bf16, weight-only).
    """
    scheme = activation_scheme(precision, static_scale)
    if scheme.code_dtype is None:
        raise UserInputError(f"{precision.value} layers do not quantize their inputs")
    _, codes, params, ctx = _quantize_rows_of(x, scheme, static_scale)
    return scheme.store_codes(codes), params, ctx  # type: ignore[return-value]


def _quantize_rows_of(x: Tensor, scheme: Scheme, static_scale: Tensor | None
                      ) -> tuple[Tensor, Tensor, QParams | None, Tensor | None]:
    if x.ndim == 0 or x.shape[-1] == 0:
        raise UserInputError(f"activations need a feature dim, got shape {tuple(x.shape)}")
    x2 = x.detach().reshape(-1, x.shape[-1]).float()
    params = None
    if static_scale is not None and not isinstance(scheme, NvFp4Scheme) and scheme.group == 0:
        if static_scale.numel() != 1:
            raise UserInputError("a static activation scale is one per-tensor value")
        params = QParams(static_scale.detach().float().reshape(1, 1).expand(x2.shape[0], 1))
    ctx = scheme.prepare(x2)
    with torch.no_grad():
        deq, codes, params = quantize_rows(x2, scheme, ctx, params)
    return deq, codes, params, ctx


__all__ = ["activation_scheme", "quantize_activation", "quantize_activation_codes"]
