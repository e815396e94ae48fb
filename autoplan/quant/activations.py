"""quantize_activation: fake-quantize a layer input as the serving kernel would, per token."""

from __future__ import annotations

from torch import Tensor

from autoplan.errors import UserInputError
from autoplan.formats import Precision
from autoplan.quant.schemes import NvFp4Scheme, RoundScheme, activation_scheme, quantize_rows


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
    if x.ndim == 0 or x.shape[-1] == 0:
        raise UserInputError(f"activations need a feature dim, got shape {tuple(x.shape)}")
    x2 = x.detach().reshape(-1, x.shape[-1]).float()
    scale = None
    if static_scale is not None and not isinstance(scheme, NvFp4Scheme) and scheme.group == 0:
        if static_scale.numel() != 1:
            raise UserInputError("a static activation scale is one per-tensor value")
        scale = static_scale.detach().float().reshape(1, 1).expand(x2.shape[0], 1)
    ctx = scheme.prepare(x2)
    deq, _, _ = quantize_rows(x2, scheme, ctx, scale)
    return deq.reshape(x.shape).to(x.dtype)


__all__ = ["quantize_activation"]
