"""Calibration statistics shared by quantization and pruning: layer Hessians for GPTQ and
SparseGPT, H = 2 X^T X / n from calibration inputs.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from autoplan.errors import AutoplanError, UserInputError


class HessianAccumulator:
    """Running ``2 X^T X / n`` over every token fed through a linear layer of ``in_features``.

    With ``full=False`` only its diagonal is kept (what Wanda's activation norms need): the
    [in, in] product is the most expensive part of scoring a layer for RTN/Wanda settings
    (65 GFLOP per 1,024 tokens for a 5632-wide down projection) and its largest buffer.
    The diagonal is accumulated on its own either way, so ``act_norm`` is the same bits with
    or without the full matrix.
    """

    def __init__(self, in_features: int, *, full: bool = True) -> None:
        self.full = full
        self._hessian = torch.zeros(in_features, in_features, dtype=torch.float32) if full \
            else None
        self._diag = torch.zeros(in_features, dtype=torch.float32)  # running mean of 2 x^2
        self.tokens = 0

    @property
    def hessian(self) -> Tensor:
        if self._hessian is None:
            raise AutoplanError("this HessianAccumulator keeps only the diagonal (full=False); "
                                "build it with full=True for GPTQ/SparseGPT")
        return self._hessian

    def add(self, x: Tensor) -> None:
        """Add a batch of layer inputs ``x`` [..., in_features]."""
        if x.shape[-1] != self._diag.shape[0]:
            raise UserInputError(
                f"inputs have {x.shape[-1]} features but the Hessian was sized for "
                f"{self._diag.shape[0]}: feed the inputs of the layer being quantized"
            )
        x2 = x.reshape(-1, x.shape[-1]).float()
        if self._diag.device != x2.device:  # follow the inputs' device (CPU or GPU)
            self._diag = self._diag.to(x2.device)
            if self._hessian is not None:
                self._hessian = self._hessian.to(x2.device)
        b = x2.shape[0]
        if b == 0:  # e.g. a routed expert no calibration token picked: nothing to add
            return
        total = self.tokens + b
        # Rescale the old mean before adding, as GPTQ does, instead of summing and dividing
        # at the end: the sum of squares of millions of tokens would lose float32 precision.
        self._diag.mul_(self.tokens / total).add_(x2.square().sum(0), alpha=2.0 / total)
        if self._hessian is not None:
            self._hessian.mul_(self.tokens / total).addmm_(x2.T, x2, alpha=2.0 / total)
        self.tokens = total

    def act_norm(self) -> Tensor:
        """Per-input-channel L2 norm of all inputs seen (what Wanda needs)."""
        return (self._diag * self.tokens / 2).clamp(min=0).sqrt()


def hessian_from_inputs(x: Tensor) -> Tensor:
    """``2 X^T X / n`` of inputs ``x`` [..., in_features] in float32."""
    acc = HessianAccumulator(x.shape[-1])
    acc.add(x)
    return acc.hessian


def prepare_hessian(hessian: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """Check a Hessian against ``w`` [out, in]; return a float32 copy and the dead-input mask.

    Inputs that never fire (zero diagonal) carry no information: the reference algorithms
    set their diagonal to 1 and their weights to 0, and so do the callers.
    """
    n = w.shape[1]
    if hessian.shape != (n, n):
        raise UserInputError(
            f"Hessian has shape {tuple(hessian.shape)} but the weight has {n} inputs: "
            f"pass a [{n}, {n}] Hessian of this layer's inputs"
        )
    h = hessian.detach().float().clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    return h, dead


def inverse_hessian_cholesky(h: Tensor, damp: float = 0.01) -> Tensor:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``.

    Dampening is retried ten times larger (up to 3 times) when H is not positive definite,
    which happens with few calibration tokens or duplicated input channels.
    """
    diag_mean = h.diagonal().mean()
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    for attempt in range(4):
        lower, info = torch.linalg.cholesky_ex(h + (damp * 10**attempt) * diag_mean * eye)
        if int(info) == 0:
            hinv = torch.cholesky_inverse(lower)
            upper, info = torch.linalg.cholesky_ex(hinv, upper=True)
            if int(info) == 0:
                return upper
    raise AutoplanError(
        "the layer Hessian is not positive definite even with 1000x dampening: "
        "use more (or more varied) calibration tokens"
    )


__all__ = [
    "HessianAccumulator",
    "hessian_from_inputs",
    "inverse_hessian_cholesky",
    "prepare_hessian",
]
