"""SimulatedLinear: an nn.Linear that computes as the compressed serving kernel would."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.formats.gguf_blocks import q8_1_min_correction
from autoplan.prune import compute_mask
from autoplan.quant.activations import quantize_activation
from autoplan.quant.weights import QuantizedWeight, quantize_weight


class SimulatedLinear(nn.Module):
    """A linear layer running one Choice: pruned, quantized weights and fake-quantized inputs.

    Forward: activations are fake-quantized as the precision's kernel does (dynamic
    per-token for FP8/INT8 W8A8, per-16/32 blocks for NVFP4/MXFP4 W4A4, unchanged for
    weight-only formats), then multiplied with the simulated weight in float32, and the
    result is cast back to the input dtype.

    Attributes:
        choice: the layer's (sparsity, precision).
        mask: keep-mask of the weight (True = kept), all True when dense.
        quantized: the QuantizedWeight (codes and scales, for auditing and export).
        act_scale: optional static activation scale (NVFP4: the FP32 global scale).
    """

    def __init__(
        self,
        quantized: QuantizedWeight,
        mask: Tensor,
        bias: Tensor | None,
        choice: Choice,
        act_scale: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.choice = choice
        self.quantized = quantized
        self.out_features, self.in_features = quantized.dequant.shape
        self.register_buffer("weight", quantized.dequant.detach().float(), persistent=False)
        self.register_buffer("mask", mask.to(torch.bool), persistent=False)
        self.register_buffer(
            "bias", None if bias is None else bias.detach().float(), persistent=False
        )
        self.act_scale = act_scale

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        choice: Choice,
        *,
        mask: Tensor | None = None,
        hessian: Tensor | None = None,
        method: str = "rtn",
        weight: Tensor | None = None,
        act_scale: Tensor | None = None,
        with_codes: bool = True,
    ) -> SimulatedLinear:
        """Compress ``linear`` to ``choice``: prune first, then quantize the pruned weight.

        The mask is applied before any scale is computed, so scales are recalibrated on the
        kept weights and pruned weights stay exactly zero.

        Args:
            linear: the original layer (left unchanged).
            choice: sparsity x precision.
            mask: keep-mask; when None and the choice is sparse, a magnitude mask is
                computed (SparseGPT when ``hessian`` is given).
            hessian: [in, in] input Hessian, for GPTQ and SparseGPT.
            method: "rtn" or "gptq".
            weight: replacement weight to quantize (e.g. ``PruneResult.weight`` from
                SparseGPT, whose kept weights are reconstructed); defaults to linear's.
            act_scale: static activation scale, see ``quantize_activation``.
            with_codes: False leaves ``quantized.codes`` None (see ``quantize_weight``):
                for a layer that is only run, never exported or audited.

        Returns:
            The SimulatedLinear.
        """
        w = linear.weight.detach() if weight is None else weight.detach()
        if w.shape != linear.weight.shape:
            raise UserInputError(
                f"replacement weight {tuple(w.shape)} does not match the layer's "
                f"{tuple(linear.weight.shape)}"
            )
        if mask is None and choice.sparsity.kind != "dense":
            score = "sparsegpt" if hessian is not None else "magnitude"
            pruned = compute_mask(w, choice.sparsity, score=score, hessian=hessian)
            mask, w = pruned.mask, pruned.weight
        if mask is not None and mask.shape != w.shape:
            raise UserInputError(
                f"mask shape {tuple(mask.shape)} does not match weight {tuple(w.shape)}"
            )
        # A dense layer has no mask to apply: quantizing with an all-True one would give the
        # same bits at the cost of three full-size elementwise passes.
        quantized = quantize_weight(w, choice.precision, method=method, hessian=hessian, mask=mask,
                                    with_codes=with_codes)
        if mask is None:
            mask = torch.ones_like(w, dtype=torch.bool)
        return cls(quantized, mask, linear.bias, choice, act_scale)

    def forward(self, x: Tensor) -> Tensor:
        """Fake-quantize ``x`` and multiply with the simulated weight in float32."""
        return self.forward_quantized(x, self.quantize_input(x))

    def quantize_input(self, x: Tensor) -> Tensor:
        """``x`` as this layer's kernel reads it (float32): the first half of ``forward``."""
        return quantize_activation(x.float(), self.choice.precision, static_scale=self.act_scale)

    def forward_quantized(self, x: Tensor, xq: Tensor) -> Tensor:
        """``forward(x)`` given ``xq = quantize_input(x)``: the profile scores several choices
        that read their inputs alike and quantizes those inputs once for all of them."""
        out = F.linear(xq, self.weight, self.bias)
        weight_min = self.quantized.scales.get("weight_min")
        if weight_min is not None:  # GGUF Q4_1/Q5_1: the dot uses the Q8_1 block sums
            out = out + q8_1_min_correction(x, weight_min)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, choice={self.choice}"


__all__ = ["SimulatedLinear"]
