"""One calibration pass that records, for every profiled linear layer, its inputs X and the
gradient G of a Fisher loss with respect to its outputs.

The loss is the cross-entropy of the model against labels SAMPLED from its own predictive
distribution (not the text's next tokens). Its expected squared gradient is the true Fisher
information, so 1/2 * sum (G * dY)^2 estimates the KL divergence a perturbation dY of the
layer's output causes -- the quantity the quality budget limits. This is the output-error x
gradient^2 score of ModelOpt's AutoQuantize, with the Fisher made exact in expectation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autoplan.models.graph import get_linear
from autoplan.models.head import chunk_rows, row_chunks, split_lm
from autoplan.models.moe import counting_routing


@dataclass
class Captured:
    """Inputs (shared between layers that read the same tensor) and output gradients."""

    inputs: dict[str, Tensor] = field(default_factory=dict)  # layer -> [T, in]
    grads: dict[str, Tensor] = field(default_factory=dict)  # layer -> [T, out]
    tokens: int = 0
    # MoE: block -> tokens routed to each expert during the pass (the calibration routing)
    routing: dict[str, list[int]] = field(default_factory=dict)


def _input_embeddings(model: nn.Module) -> nn.Module:
    return model.get_input_embeddings()


class Recorder:
    """Hooks that record, for named linears, inputs X (forward) and output gradients G
    (backward), batch by batch; used on a whole model or on one resident block."""

    def __init__(self, model: nn.Module, layer_names: Iterable[str]) -> None:
        self.names = list(layer_names)
        self.xs: dict[str, list[Tensor]] = {n: [] for n in self.names}
        self.gs: dict[str, list[Tensor]] = {n: [] for n in self.names}
        self._model = model
        self._handles: list = []

    def __enter__(self) -> Recorder:
        for name in self.names:
            def fwd(_m, inputs, out, name=name):  # noqa: ANN001 - torch hook signature
                self.xs[name].append(inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float())
                if out.requires_grad:
                    out.register_hook(lambda g, name=name: self.gs[name].append(
                        g.detach().reshape(-1, g.shape[-1]).float()))

            self._handles.append(get_linear(self._model, name).register_forward_hook(fwd))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _empty(self, out: Captured, name: str) -> None:
        weight = get_linear(self._model, name).weight
        out.inputs[name] = torch.zeros(0, weight.shape[1], device=weight.device)
        out.grads[name] = torch.zeros(0, weight.shape[0], device=weight.device)
        self.xs.pop(name)
        self.gs.pop(name)

    def result(self, tokens: int) -> Captured:
        out = Captured(tokens=tokens)
        shared: dict[tuple[int, ...], Tensor] = {}
        for name in self.names:
            if not self.xs[name]:  # a routed expert no calibration token picked
                self._empty(out, name)
                continue
            # q/k/v (and gate/up) read the same input tensor: keep one copy.
            xs = self.xs.pop(name)
            key = tuple(t.data_ptr() for t in xs)
            if key not in shared:
                shared[key] = torch.cat(xs)
            out.inputs[name] = shared[key]
            # Backward visits batches in forward order; within a batch hooks fire once each.
            # Popped as they are joined: the per-batch pieces of one layer at a time coexist
            # with their concatenation, not every layer's.
            out.grads[name] = torch.cat(self.gs.pop(name))
            del xs
        self.xs.clear()
        self.gs.clear()
        return out


def sample_labels(logits: Tensor, gen: torch.Generator) -> Tensor:
    """Labels drawn from the model's own predictive distribution (the Fisher's labels).

    Drawn on the CPU from a CPU generator whatever the device, so the same seed gives the
    same labels on every device (up to the logits' own rounding)."""
    with torch.no_grad():
        probs = torch.softmax(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
        labels = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1)
    return labels.to(logits.device)


def fisher_loss(logits: Tensor, gen: torch.Generator) -> Tensor:
    """Summed cross-entropy against sampled labels."""
    logits = logits.float()
    labels = sample_labels(logits, gen)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels, reduction="sum")


def fisher_backward(head: Callable[[Tensor], Tensor], hidden: Tensor, gen: torch.Generator,
                    rows: int) -> Tensor:
    """Back-propagate the Fisher loss from the decoder's output `hidden` [b, seq, h] through
    `head`, `rows` positions at a time (the logits never exist for the whole batch): labels
    are drawn in the order the whole batch's logits list them, so from one generator they
    are the ones an unchunked pass draws. Returns the gradient at `hidden` (also sent on
    into the decoder's graph when `hidden` has one)."""
    detached = hidden.detach().requires_grad_(True)
    for _start, _part, logits in row_chunks(head, detached, rows):
        fisher_loss(logits, gen).backward()
    grad = detached.grad
    if hidden.requires_grad:
        hidden.backward(grad)
    return grad


@contextmanager
def activation_grads(model: nn.Module) -> Iterator[None]:
    """Within the block, a backward pass gives gradients to activations only: parameters
    are frozen, and the embedding output is made to require grad so the graph is built."""
    emb = _input_embeddings(model).register_forward_hook(
        lambda _m, _i, out: out.detach().requires_grad_(True))
    requires = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        emb.remove()
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)


def capture(
    model: nn.Module, layer_names: Iterable[str], batches: Iterable[Tensor], *, seed: int = 0
) -> Captured:
    """Run forward + backward over `batches` ([b, seq] token ids) and record X and G.

    Parameters are not trained: gradients flow only to activations (`activation_grads`).
    """
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    tokens = 0
    split = split_lm(model)
    rows = chunk_rows(model.config.vocab_size)
    with activation_grads(model), Recorder(model, layer_names) as rec, \
            counting_routing(model) as routing:
        for batch in batches:
            if split is None:
                fisher_loss(model(input_ids=batch.to(device)).logits, gen).backward()
            else:  # the head a chunk of positions at a time (models/head.py)
                fisher_backward(split.head, split.body(batch.to(device)), gen, rows)
            tokens += batch.numel()
    out = rec.result(tokens)
    out.routing = routing.as_lists()  # MoE: tokens each expert got (the calibration routing)
    return out


__all__ = ["Captured", "Recorder", "activation_grads", "capture", "fisher_backward",
           "fisher_loss", "sample_labels"]
