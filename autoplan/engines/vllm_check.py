"""Does vLLM run a plan's export the way autoplan simulated it? Logprobs side by side.

The simulation is the plan's own: the ``SimulatedLinear`` layers ``export.prepare``
recomputes for the export (the codes and scales the checkpoint holds, verified bit for bit
by the exporter), swapped into a copy of the model and run in fp32. vLLM runs the checkpoint
in ``dtype`` (bf16 on CPU by default), so the two differ by vLLM's own 16-bit arithmetic
even where the quantized weights are identical. The tolerance is therefore measured, not
picked: the same comparison on the unquantized model (``noise``: vLLM bf16 vs autoplan fp32,
no quantization anywhere) gives the engine's arithmetic noise floor, and a plan agrees when
its teacher-forced logprob differences stay within a small multiple of that floor while the
quantization itself moves the logprobs much further (``quant_effect``), so a wrong code,
scale, zero point or group layout would show up as a difference far above the floor.

Public API:
    simulated_model(plan, loaded, *, stats=None, calibration=None) -> nn.Module
    reference_logprobs(model, prompts, continuations=None) -> list[dict]
    compare(engine_results, reference) -> dict
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from autoplan.models.graph import set_module


def simulated_model(plan: Any, loaded: Any, *, stats: Any = None,
                    calibration: Any = None) -> nn.Module:
    """A copy of the model with every planned layer replaced by the layer the export holds."""
    from autoplan.export import get_exporter
    from autoplan.export._prepare import prepare

    exporter = get_exporter("compressed-tensors")
    prep = prepare(plan, loaded, exporter.name, exporter.runtimes, stats=stats,
                   calibration=calibration, allow_model_mismatch=False)
    model = copy.deepcopy(loaded.model)
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head" in prep.sims:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    for name, sim in prep.sims.items():
        set_module(model, name, sim)
    return model.eval()


@torch.inference_mode()
def reference_logprobs(model: nn.Module, prompts: Sequence[Sequence[int]],
                       continuations: Sequence[Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """The reference's view of the engine's output, from one forward pass per sequence.

    Per prompt: ``prompt_logprobs`` (teacher forced; None first, as vLLM reports them) and,
    for the engine's greedy continuation: the reference's own greedy pick at each step
    given the engine's tokens before it (``tokens``), the logprob it gives the engine's
    token (``logprobs``), and its top-2 margin (``margins``). Up to the first step where the
    picks differ this is exactly the reference's own greedy decoding.
    """
    out = []
    for i, prompt in enumerate(prompts):
        ids = list(map(int, prompt))
        cont = list(map(int, continuations[i])) if continuations else []
        x = torch.tensor([ids + cont], dtype=torch.long)
        lp = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0].float(), dim=-1)
        seq = ids + cont
        prompt_lps = [None] + [float(lp[j - 1, seq[j]]) for j in range(1, len(ids))]
        steps = lp[len(ids) - 1:len(seq) - 1]
        top = torch.topk(steps, 2, dim=-1) if len(cont) else None
        out.append({
            "prompt_logprobs": prompt_lps,
            "tokens": top.indices[:, 0].tolist() if top is not None else [],
            "logprobs": [float(steps[k, t]) for k, t in enumerate(cont)],
            "margins": (top.values[:, 0] - top.values[:, 1]).tolist() if top is not None else []})
    return out


def _diffs(a: Sequence[float | None], b: Sequence[float | None]) -> list[float]:
    return [abs(x - y) for x, y in zip(a, b) if x is not None and y is not None]


def compare(engine: Sequence[dict[str, Any]], ref: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Teacher-forced logprob differences and greedy agreement of an engine vs a reference
    (``ref`` from ``reference_logprobs`` on the engine's own continuations).

    Returns:
        ``prompt_lp_abs_mean`` / ``prompt_lp_abs_max``: |engine - reference| over every
        prompt token (same context on both sides); ``greedy_same``: engine greedy tokens the
        reference also picks, counted up to the first divergence, out of ``greedy_total``;
        ``diverged_at_margin``: the reference's top-2 margin (nats) at each divergence (a
        near tie when it is within the logprob noise); ``greedy_lp_abs_max``: |logprob|
        differences of the agreeing greedy tokens.
    """
    prompt_d, greedy_d, same, total, margins = [], [], 0, 0, []
    for e, r in zip(engine, ref, strict=True):
        prompt_d += _diffs(e["prompt_logprobs"], r["prompt_logprobs"])
        total += len(e["tokens"])
        for i, (te, tr) in enumerate(zip(e["tokens"], r["tokens"])):
            if te != tr:
                margins.append(round(r["margins"][i], 4))
                break
            same += 1
            if e["logprobs"][i] is not None:
                greedy_d.append(abs(e["logprobs"][i] - r["logprobs"][i]))
    return {"prompt_lp_abs_mean": sum(prompt_d) / max(len(prompt_d), 1),
            "prompt_lp_abs_max": max(prompt_d, default=math.nan),
            "prompt_tokens": len(prompt_d), "greedy_same": same, "greedy_total": total,
            "diverged_at_margin": margins,
            "greedy_lp_abs_max": max(greedy_d, default=0.0)}


__all__ = ["compare", "reference_logprobs", "simulated_model"]
