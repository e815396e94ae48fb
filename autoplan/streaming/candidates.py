"""Measuring compressed candidates of one original model: the `Evaluator` protocol the
search's Verifier measures through, and its in-memory implementation (`MemoryEvaluator`;
the block-streamed one is `streaming.evaluate.StreamedEvaluator`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

from autoplan.compress import CompressionSettings, audit_digests, compressed_copy
from autoplan.formats import Choice
from autoplan.quality.evaluator import QualityEvaluator, QualityResult, as_module
from autoplan.quality.metrics import ReferenceLogprobs
from autoplan.quant.kv_cache import KvQuant
from autoplan.sensitivity.executor import Executor, SerialExecutor

# The calibration statistics (layer input Hessians), computed on first use and shared.
Stats = Callable[[], dict]
# (index of the task, (its quality, the audit digests of its compressed tensors))
Measured = tuple[int, tuple[QualityResult, dict]]


@dataclass(frozen=True)
class CandidateTask:
    """One candidate to measure: its per-layer decisions and what its measurement needs."""

    decisions: dict[str, Choice]
    use_stats: bool  # Wanda/SparseGPT masks or GPTQ need the calibration statistics
    slices: bool = True  # measure the KL slices too (when the evaluator has them)
    # stop the pass once the KL is certain to exceed this (QualityEvaluator.evaluate)
    kl_limit: float | None = None
    kv: dict[int, KvQuant] | None = None  # the simulated KV cache (None: the model's own)


class Evaluator(Protocol):
    """Measures candidates of one original model against it, in memory or streamed."""

    reference: ReferenceLogprobs

    @property
    def has_slices(self) -> bool:
        """Whether it measures the KL slices (the streamed evaluator has none)."""

    @property
    def in_memory(self) -> bool:
        """Whether the compressed model exists whole in memory (a recovery pass trains it)."""

    def measure(self, tasks: Sequence[CandidateTask], settings: CompressionSettings,
                baseline: Choice, stats: Stats, executor: Executor | None,
                long: Evaluator | None = None) -> Iterator[Measured]:
        """Each task's quality and audit, in completion order, on `executor` (None: here);
        with `long` (a compressed KV cache), the long-prompt split measured by it too
        (`with_long_context`)."""

    def measure_slices(self, task: CandidateTask, settings: CompressionSettings,
                       baseline: Choice, stats: Stats) -> dict[str, float]:
        """The KL per slice of one candidate (the same weights as its measurement)."""

    def evaluate(self, model: torch.nn.Module, *, slices: bool = True) -> QualityResult:
        """A whole model held in memory, measured (`in_memory` evaluators only: a recovery
        pass measures the model it trained)."""

    def with_reference(self, decisions: dict[str, Choice], settings: CompressionSettings,
                       baseline: Choice) -> Evaluator:
        """A copy that measures candidates against the original with ``decisions`` applied
        (weights rounded to nearest with ``settings``) instead of the original itself."""


@dataclass(frozen=True)
class CandidateContext:
    """What every candidate's evaluation shares (a distributed executor ships it once)."""

    model: torch.nn.Module
    evaluator: QualityEvaluator
    stats: dict | None
    settings: CompressionSettings
    baseline: Choice
    long_evaluator: Evaluator | None = None  # the long-prompt split (a compressed KV cache)


def compressed_candidate(ctx: CandidateContext, task: CandidateTask) -> tuple:
    """A copy of the model compressed to one candidate's decisions (and KV cache), and its
    swapped layers."""
    return compressed_copy(ctx.model, task.decisions, ctx.stats if task.use_stats else None,
                           ctx.settings, baseline=ctx.baseline, kv=task.kv)


def with_long_context(quality: QualityResult, long: QualityResult) -> QualityResult:
    """``quality`` with the long-prompt split's KL and its gates (the long-context check)."""
    return dataclasses.replace(quality, kl_long=long.kl, gates=quality.gates | long.gates,
                               seconds=quality.seconds + long.seconds)


def evaluate_candidate(ctx: CandidateContext, task: CandidateTask) -> tuple[QualityResult, dict]:
    """Compress a copy of the model to one candidate's decisions and measure it: a pure
    function of its arguments, so it can run on any worker. With a compressed KV cache the
    long-prompt split and the long-context check are measured too."""
    compressed, swapped = compressed_candidate(ctx, task)
    with torch.no_grad():
        quality = ctx.evaluator.evaluate(compressed, slices=task.slices,
                                         kl_limit=task.kl_limit)
        if task.kv and ctx.long_evaluator is not None and not quality.stopped_early:
            quality = with_long_context(quality, ctx.long_evaluator.evaluate(compressed,
                                                                             slices=False))
    # a candidate certain to fail is never planned: its weights need no audit
    return quality, {} if quality.stopped_early else audit_digests(swapped)


class MemoryEvaluator(QualityEvaluator):
    """A QualityEvaluator that also measures candidates of its own reference model: each a
    compressed deep copy, on the executor's workers or here."""

    in_memory = True

    def __init__(self, reference_model: torch.nn.Module, eval_tokens: torch.Tensor,
                 **kwargs: Any) -> None:  # QualityEvaluator's keywords
        super().__init__(reference_model, eval_tokens, **kwargs)
        self.model = as_module(reference_model)

    def _context(self, settings: CompressionSettings, baseline: Choice,
                 stats: dict | None, long: Evaluator | None = None) -> CandidateContext:
        return CandidateContext(self.model, self, stats, settings, baseline, long)

    def measure(self, tasks: Sequence[CandidateTask], settings: CompressionSettings,
                baseline: Choice, stats: Stats, executor: Executor | None,
                long: Evaluator | None = None) -> Iterator[Measured]:
        ctx = self._context(settings, baseline,
                            stats() if any(t.use_stats for t in tasks) else None, long)
        yield from (executor or SerialExecutor()).imap_unordered(
            partial(evaluate_candidate, ctx), tasks)

    def measure_slices(self, task: CandidateTask, settings: CompressionSettings,
                       baseline: Choice, stats: Stats) -> dict[str, float]:
        ctx = self._context(settings, baseline, stats() if task.use_stats else None)
        compressed, _ = compressed_candidate(ctx, task)
        with torch.no_grad():
            return self.slice_kl(compressed)

    def with_reference(self, decisions: dict[str, Choice], settings: CompressionSettings,
                       baseline: Choice) -> MemoryEvaluator:
        compressed, _ = compressed_copy(self.model, decisions, None, settings, baseline=baseline)
        return self.rebased(compressed)


__all__ = ["CandidateContext", "CandidateTask", "Evaluator", "Measured", "MemoryEvaluator",
           "Stats", "compressed_candidate", "evaluate_candidate", "with_long_context"]
