"""RecoverableLinear: a SimulatedLinear made trainable, for a recovery pass.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autoplan.formats.gguf_blocks import q8_1_min_correction
from autoplan.quant import SimulatedLinear, quantize_activation, quantize_weight
from autoplan.quant.weights import QuantizedWeight


class _StraightThrough(torch.autograd.Function):
    """``rounded`` in the forward, the identity's gradient to ``x`` in the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, rounded: Tensor) -> Tensor:  # noqa: ANN001 - autograd ctx
        return rounded

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: ANN001 - autograd ctx
        return grad, None


def straight_through(x: Tensor, rounded: Tensor) -> Tensor:
    """``rounded`` in the forward, the identity's gradient in the backward.

    One autograd node that returns ``rounded`` itself, rather than ``x + (rounded - x)
    .detach()``: that spelling costs two full-size elementwise ops per layer and step (a
    tenth of a recovery step on SmolLM2) and is ``rounded`` only up to fp32 rounding.
    """
    if not x.requires_grad:
        return rounded
    return _StraightThrough.apply(x, rounded)


class RecoverableLinear(nn.Linear):
    """A compressed layer whose fp32 master weight can train under its fixed mask."""

    def __init__(self, sim: SimulatedLinear, *, trainable: bool) -> None:
        nn.Module.__init__(self)  # nn.Linear.__init__ would allocate and initialize a weight
        self.in_features, self.out_features = sim.in_features, sim.out_features
        self.choice = sim.choice
        self.act_scale = sim.act_scale
        self.register_buffer("mask", sim.mask.detach().clone(), persistent=False)
        self.weight = nn.Parameter(sim.weight.detach().float() * self.mask,
                                   requires_grad=trainable)
        self.bias = None if sim.bias is None else nn.Parameter(sim.bias.detach().float(),
                                                              requires_grad=False)
        # a frozen weight is quantized once: the SimulatedLinear's own codes
        self._frozen: QuantizedWeight | None = None if trainable else sim.quantized

    def _quantized(self) -> QuantizedWeight:
        if self._frozen is not None:
            return self._frozen
        with torch.no_grad():  # codes are not needed to run the layer (export recomputes)
            return quantize_weight(self.weight.detach(), self.choice.precision, mask=self.mask,
                                   with_codes=False)

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xq = straight_through(xf, quantize_activation(
            xf, self.choice.precision, static_scale=self.act_scale).float())
        q = self._quantized()
        wq = q.dequant.float()  # the format's weight, already zero where pruned
        if self.weight.requires_grad:  # its gradient reaches the master weight unrounded
            wq = straight_through(self.weight, wq)
        out = F.linear(xq, wq, self.bias)
        weight_min = q.scales.get("weight_min")
        if weight_min is not None:  # GGUF Q4_1/Q5_1: the dot uses the Q8_1 block sums
            out = out + q8_1_min_correction(x, weight_min)
        return out.to(x.dtype)

    @torch.no_grad()
    def mask_grad(self) -> None:
        """Zero the master weight's gradient where pruned, before clipping and the step.

        The forward hands the gradient straight through to the master weight, pruned
        positions included; zeroing it here, once per step and in place, gives the bits the
        forward's ``weight * mask`` gave (its backward multiplied by the mask), without two
        full-size temporaries per layer and step."""
        if self.weight.grad is not None:
            self.weight.grad.mul_(self.mask)

    @torch.no_grad()
    def apply_mask(self) -> None:
        """Zero the pruned positions (after an optimizer step)."""
        self.weight.mul_(self.mask)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"choice={self.choice}, trainable={self.weight.requires_grad}")


__all__ = ["RecoverableLinear", "straight_through"]
