"""Apply per-layer decisions to a real model: calibration statistics, then prune and
quantize each linear exactly as its format defines, swapping in SimulatedLinear modules.

Statistics are taken once from the ORIGINAL model's activations (one forward pass over the
calibration tokens); every layer is then compressed independently. This keeps profiling,
verification and export consistent: the same (layer, choice, settings, statistics) always
gives the same weights. Sequential (compressed-input) calibration as in the GPTQ paper is a
possible refinement, not done here.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models.graph import get_linear, set_module
from autoplan.numerics import current_threads, pinned_threads
from autoplan.prune import PruneScore, compute_mask
from autoplan.quant import HessianAccumulator, QuantMethod, SimulatedLinear
from autoplan.quant.kv_cache import KvQuant, attach_kv


@dataclass(frozen=True)
class CompressionSettings:
    """How masks and quantized weights are computed (the choice says what, this says how)."""

    prune_score: PruneScore = PruneScore.WANDA
    quant_method: QuantMethod = QuantMethod.RTN
    # torch threads the SparseGPT/GPTQ solvers run on (None: the process's): their bits
    # depend on it (autoplan/numerics.py), so a search fixes it and its plan records it
    solver_threads: int | None = None

    def __post_init__(self) -> None:  # text in, members stored (UserInputError if unknown)
        object.__setattr__(self, "prune_score", PruneScore.parse(self.prune_score))
        object.__setattr__(self, "quant_method", QuantMethod.parse(self.quant_method))
        if self.solver_threads is not None and self.solver_threads < 1:
            raise UserInputError(f"solver threads must be at least 1, got {self.solver_threads}")

    @property
    def needs_hessian(self) -> bool:
        return self.prune_score is PruneScore.SPARSEGPT or self.quant_method is QuantMethod.GPTQ

    def pinned(self) -> CompressionSettings:
        """These settings with the solver thread count fixed (to this process's when unset)."""
        if self.solver_threads is not None:
            return self
        return dataclasses.replace(self, solver_threads=current_threads())


@torch.no_grad()
def observe_inputs(model: nn.Module, layer_names: Iterable[str], batches: Iterable[Tensor],
                   observe: Callable[[str, Tensor], None]) -> None:
    """Run `batches` (token ids) through `model`, calling observe(name, input) for every
    named linear layer on every batch."""
    handles = []
    for name in layer_names:
        def hook(_m, inputs, _out, name=name):  # noqa: ANN001 - torch hook signature
            observe(name, inputs[0])

        handles.append(get_linear(model, name).register_forward_hook(hook))
    device = next(model.parameters()).device
    try:
        for batch in batches:
            model(input_ids=batch.to(device))
    finally:
        for h in handles:
            h.remove()


def collect_stats(
    model: nn.Module, layer_names: Iterable[str], batches: Iterable[Tensor], *,
    full: bool = True,
) -> dict[str, HessianAccumulator]:
    """Input Hessians (2 X^T X / n; the diagonal gives Wanda's norms) of the named linears;
    with ``full=False`` only their diagonals (enough unless GPTQ or SparseGPT runs)."""
    names = list(layer_names)
    stats = {n: HessianAccumulator(get_linear(model, n).in_features, full=full) for n in names}
    observe_inputs(model, names, batches, lambda n, x: stats[n].add(x))
    return stats


def compress_linear(
    linear: nn.Linear, choice: Choice, stats: HessianAccumulator | None,
    settings: CompressionSettings, *, masks: dict | None = None, with_codes: bool = True,
) -> SimulatedLinear:
    """Prune (mask first, so scales are calibrated on kept weights) then quantize one layer.

    `masks`: a dict kept across calls for the same layer, statistics and settings (the
    profile scores one layer for several choices): a sparsity pattern's mask (and SparseGPT's
    reconstructed weight) does not depend on the precision, so 2:4 with bf16, FP8 and INT8
    prune once. `with_codes=False`: the layer is only run (the profile), so its stored codes
    are not kept (see `quantize_weight`).
    """
    with pinned_threads(settings.solver_threads):
        return _compress_linear(linear, choice, stats, settings, masks, with_codes)


def _compress_linear(linear: nn.Linear, choice: Choice, stats: HessianAccumulator | None,
                     settings: CompressionSettings, masks: dict | None,
                     with_codes: bool) -> SimulatedLinear:
    hessian = stats.hessian if stats is not None and settings.needs_hessian else None
    weight = None
    mask = None
    if choice.sparsity.kind != "dense":
        score = settings.prune_score
        if stats is None and score is not PruneScore.MAGNITUDE:
            raise UserInputError(f"pruning score '{score}' needs calibration statistics")
        pruned = masks.get(choice.sparsity) if masks is not None else None
        if pruned is None:
            pruned = compute_mask(
                linear.weight.detach(), choice.sparsity, score=score,
                act_norm=stats.act_norm() if stats is not None else None,
                hessian=hessian if score == "sparsegpt" else None,
            )
            if masks is not None:
                masks[choice.sparsity] = pruned
        mask, weight = pruned.mask, pruned.weight
    return SimulatedLinear.from_linear(
        linear, choice, mask=mask, weight=weight,
        hessian=hessian if settings.quant_method == "gptq" else None,
        method=settings.quant_method, with_codes=with_codes,
    )


def recompress_linear(
    linear: nn.Linear, choice: Choice, mask: Tensor, weight: Tensor,
    stats: HessianAccumulator | None, settings: CompressionSettings,
) -> SimulatedLinear:
    """Re-apply ``choice``'s format to a recovered ``weight`` under the layer's ``mask``.

    The mask is the one the layer was pruned with (kept exactly: a recovered weight is
    multiplied by it first), the scales are recomputed from the recovered weight (RTN, or
    GPTQ with the original's input Hessian), so the layer holds what will run.
    """
    # only GPTQ reads the full Hessian (stats may keep just its diagonal otherwise)
    gptq = settings.quant_method == "gptq"
    hessian = stats.hessian if stats is not None and gptq else None
    sparse = choice.sparsity.kind != "dense"
    w = weight.detach().to(linear.weight.dtype) * mask if sparse else \
        weight.detach().to(linear.weight.dtype)
    with pinned_threads(settings.solver_threads):
        return SimulatedLinear.from_linear(
            linear, choice, mask=mask if sparse else None, weight=w,
            hessian=hessian, method=settings.quant_method,
        )


def compressed_copy(
    model: nn.Module, decisions: Mapping[str, Choice],
    stats: Mapping[str, HessianAccumulator] | None, settings: CompressionSettings,
    baseline: Choice | None = None, kv: Mapping[int, KvQuant] | None = None,
) -> tuple[nn.Module, dict[str, SimulatedLinear]]:
    """A copy of `model` with every decided layer replaced by its SimulatedLinear, and with
    `kv` (block -> KvQuant) simulating its KV cache inside attention.

    The copy is a new module tree whose parameters and buffers ARE the original's tensors
    (nothing changes them: a decided layer is replaced, never written), so it costs the
    compressed layers alone, not a second model (for Gemma 3's 262k x 640 embedding, 0.6 GiB
    per verification). Layers whose choice equals `baseline` (e.g. dense+fp32 on CPU) are
    left as they are. A tied lm_head is untied in the copy (its module replaced) so
    compressing it never touches the embeddings.
    """
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    out = copy.deepcopy(model, shared)
    if kv:
        attach_kv(out, kv)  # the copy keeps them: it is measured, then dropped
    swapped: dict[str, SimulatedLinear] = {}
    for name, choice in decisions.items():
        if baseline is not None and choice == baseline:
            continue
        sim = compress_linear(get_linear(out, name), choice,
                              stats.get(name) if stats else None, settings)
        set_module(out, name, sim)
        swapped[name] = sim
    return out, swapped


def tensor_digest(t: Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (for the plan's audit section)."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def audit_digests(swapped: Mapping[str, SimulatedLinear]) -> dict[str, dict[str, str]]:
    """layer -> {mask, weight, each scale tensor -> sha256}."""
    out: dict[str, dict[str, str]] = {}
    for name, sim in sorted(swapped.items()):
        entry = {"mask": tensor_digest(sim.mask), "weight": tensor_digest(sim.weight)}
        for key, scale in sorted(sim.quantized.scales.items()):
            entry[key] = tensor_digest(scale)
        out[name] = entry
    return out


__all__ = [
    "CompressionSettings", "audit_digests", "collect_stats", "compress_linear",
    "compressed_copy", "observe_inputs", "recompress_linear", "tensor_digest",
]
