"""One calibration pass that records, for every profiled linear layer, its inputs X and the
gradient G of a Fisher loss with respect to its outputs.

The loss is the cross-entropy of the model against labels SAMPLED from its own predictive
distribution (not the text's next tokens). Its expected squared gradient is the true Fisher
information, so 1/2 * sum (G * dY)^2 estimates the KL divergence a perturbation dY of the
layer's output causes -- the quantity the quality budget limits. This is the output-error x
gradient^2 score of ModelOpt's AutoQuantize, with the Fisher made exact in expectation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autoplan.models.graph import get_linear


@dataclass
class Captured:
    """Inputs (shared between layers that read the same tensor) and output gradients."""

    inputs: dict[str, Tensor] = field(default_factory=dict)  # layer -> [T, in]
    grads: dict[str, Tensor] = field(default_factory=dict)  # layer -> [T, out]
    tokens: int = 0


def _input_embeddings(model: nn.Module) -> nn.Module:
    return model.get_input_embeddings()


def capture(
    model: nn.Module, layer_names: Iterable[str], batches: Iterable[Tensor], *, seed: int = 0
) -> Captured:
    """Run forward + backward over `batches` ([b, seq] token ids) and record X and G.

    Parameters are not trained: gradients flow only to activations (the embedding output
    is made to require grad so the graph is built without parameter gradients).
    """
    names = list(layer_names)
    xs: dict[str, list[Tensor]] = {n: [] for n in names}
    gs: dict[str, list[Tensor]] = {n: [] for n in names}
    handles = []
    for name in names:
        linear = get_linear(model, name)

        def fwd(_m, inputs, out, name=name):  # noqa: ANN001 - torch hook signature
            xs[name].append(inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float())
            out.register_hook(lambda g, name=name: gs[name].append(
                g.detach().reshape(-1, g.shape[-1]).float()))

        handles.append(linear.register_forward_hook(fwd))
    handles.append(_input_embeddings(model).register_forward_hook(
        lambda _m, _i, out: out.detach().requires_grad_(True)))
    requires = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    tokens = 0
    try:
        for batch in batches:
            logits = model(input_ids=batch).logits.float()
            with torch.no_grad():
                probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
                labels = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels, reduction="sum")
            loss.backward()
            tokens += batch.numel()
    finally:
        for h in handles:
            h.remove()
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)
    out = Captured(tokens=tokens)
    shared: dict[tuple[int, ...], Tensor] = {}
    for name in names:
        # q/k/v (and gate/up) read the same input tensor: keep one copy.
        key = tuple(t.data_ptr() for t in xs[name])
        if key not in shared:
            shared[key] = torch.cat(xs[name])
        out.inputs[name] = shared[key]
        # Backward visits batches in forward order, but within a batch hooks fire once each.
        out.grads[name] = torch.cat(gs[name])
    return out


__all__ = ["Captured", "capture"]
