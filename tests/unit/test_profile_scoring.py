"""The profile's scoring loop against the straightforward per-choice formula.

`score_task` shares work between a layer's choices (one fake-quantized input per precision,
no stored codes, the score arithmetic in place); each of those steps is meant to give the
same bits. Here every registered precision, dense and under each sparsity kind, is scored
both ways on a small layer, with and without a bias, for bf16 and fp32 weights and for the
Hessian-based settings, and the scores must be equal, not merely close.
"""

from __future__ import annotations

import pytest
import torch

from autoplan.compress import CompressionSettings, compress_linear
from autoplan.formats import Choice, Sparsity
from autoplan.formats.registry import registered_formats
from autoplan.quant import HessianAccumulator
from autoplan.sensitivity.profile import ScoreTask, score_task
from tests.unit._tiny import one_torch_thread  # noqa: F401

SPARSITIES = (Sparsity(), Sparsity.parse("2:4"), Sparsity.parse("unstructured@50"),
              Sparsity.parse("block16@50"), Sparsity.parse("channel@25"))
CHOICES = tuple(Choice(sp, spec.precision) for spec in registered_formats() for sp in SPARSITIES)


def _reference_scores(task: ScoreTask) -> dict[str, float]:
    """Each choice on its own: compress the layer, run it, 1/2 mean_t sum_j (G * dY)^2."""
    linear = torch.nn.Linear(task.weight.shape[1], task.weight.shape[0],
                             bias=task.bias is not None)
    with torch.no_grad():
        linear.weight = torch.nn.Parameter(task.weight, requires_grad=False)
        if task.bias is not None:
            linear.bias = torch.nn.Parameter(task.bias, requires_grad=False)
        x, g = task.inputs, task.grads
        stats = HessianAccumulator(x.shape[1], full=task.settings.needs_hessian)
        stats.add(x)
        y_ref = x @ linear.weight.detach().float().T
        bias = linear.bias.detach().float() if linear.bias is not None else 0.0
        out = {}
        for choice in task.choices:
            sim = compress_linear(linear, choice, stats, task.settings)
            dy = sim(x) - bias - y_ref
            out[str(choice)] = 0.5 * float((g.square() * dy.square()).sum()) / task.tokens
    return out


def _task(dtype: torch.dtype, bias: bool, settings: CompressionSettings,
          choices: tuple[Choice, ...]) -> ScoreTask:
    gen = torch.Generator().manual_seed(3)
    out_f, in_f, tokens = 32, 128, 24
    w = (torch.randn(out_f, in_f, generator=gen) * 0.05).to(dtype)
    x = torch.randn(tokens, in_f, generator=gen).to(dtype).float()
    x[:, 5] *= 20.0  # an outlier channel, as real activations have
    x[3] = 0.0  # an all-zero token: the zero-scale paths of dynamic input quantization
    g = torch.randn(tokens, out_f, generator=gen) * 1e-2
    b = (torch.randn(out_f, generator=gen) * 0.1).to(dtype) if bias else None
    return ScoreTask("layer", w, b, x, g, tokens, choices, settings)


@pytest.mark.parametrize(("dtype", "bias"), [(torch.bfloat16, False), (torch.float32, True)])
def test_fast_scores_equal_the_per_choice_formula_for_every_format(
        dtype: torch.dtype, bias: bool) -> None:
    task = _task(dtype, bias, CompressionSettings(), CHOICES)
    fast = score_task(task).scores
    ref = _reference_scores(task)
    assert set(fast) == {str(c) for c in CHOICES}
    mismatched = {k: (fast[k], ref[k]) for k in ref if fast[k] != ref[k]}
    assert not mismatched
    assert sum(v > 0 for v in fast.values()) > len(fast) // 2  # the formats do change y


@pytest.mark.parametrize("settings", [CompressionSettings("sparsegpt", "gptq"),
                                      CompressionSettings("magnitude", "gptq")])
def test_fast_scores_equal_the_formula_with_hessian_settings(
        settings: CompressionSettings) -> None:
    picks = tuple(Choice.parse(c) for c in (
        "dense+int8", "dense+int4_g64", "2:4+fp8_e4m3", "2:4+bf16", "dense+nvfp4",
        "unstructured@50+uint4_g32", "dense+q4_1", "dense+fp8_b128"))
    task = _task(torch.bfloat16, True, settings, picks)
    assert score_task(task).scores == _reference_scores(task)
