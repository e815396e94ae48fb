"""QualityEvaluator: measure a (compressed) model against the original, one pass per model.

Construction runs the original once (reference log-probs, its perplexity and, with a suite,
its greedy continuations and suite score). Each ``evaluate(model)`` then costs one forward
pass over the evaluation tokens plus, with a suite, two short passes per prompt. The
original may be modified in place afterwards (layers swapped by ``set_module``): everything
the evaluator needs from it is captured at construction.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from autoplan.quality.metrics import ReferenceLogprobs, bounded_compare_pass, reference_pass
from autoplan.quality.slices import SliceSet, slice_kl, slice_reference
from autoplan.quality.suite import PromptSuite, score_suite, suite_reference

if TYPE_CHECKING:
    from autoplan.models import LoadedModel


class Gate(Protocol):
    """A check scored in points (higher is better), compared with the original's score:
    the long-context check (``longctx``), an lm-eval task (``lm-eval:TASK``)."""

    name: str

    def score(self, model: nn.Module) -> tuple[float, dict[str, float]]:
        """(score in points, further metrics by name)."""
        ...


@dataclass(frozen=True)
class GateResult:
    """A gate's score for one model next to the original's."""

    score: float
    reference: float
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def delta(self) -> float:
        return self.score - self.reference


@dataclass(frozen=True)
class QualityResult:
    """Measured quality of one model next to the original.

    Attributes:
        ppl: perplexity of the model on the evaluation tokens.
        ppl_ref: perplexity of the original on the same tokens.
        kl: mean per-token KL(P_orig || P_model) in nats (0 for an identical model).
        n_tokens: evaluation tokens (positions) the KL averages over.
        seconds: wall time of this evaluation.
        suite_score, suite_score_ref: suite score (0-100) of the model and of the original.
        suite_agreement: greedy-token agreement with the original (0-100).
        slices: slice name -> mean KL over that slice's positions (``quality.slices``).
        gates: gate name -> its score beside the original's.
        stopped_early: the pass stopped once the KL was certain to exceed the limit it was
            given (``evaluate(kl_limit=...)``): ``kl`` is then a lower bound, ``ppl`` covers
            the blocks measured, and no suite, slice or gate was run.
        kl_long: mean KL over the long-prompt split (blocks of >= 2k tokens), measured
            whenever the KV cache is compressed; None otherwise.
    """

    ppl: float
    ppl_ref: float
    kl: float
    n_tokens: int
    seconds: float
    suite_score: float | None = None
    suite_score_ref: float | None = None
    suite_agreement: float | None = None
    slices: dict[str, float] = field(default_factory=dict)
    gates: dict[str, GateResult] = field(default_factory=dict)
    stopped_early: bool = False
    kl_long: float | None = None  # the long-prompt split's KL, measured with a compressed KV

    def __post_init__(self) -> None:  # read back from JSON (asdict): gates as plain dicts
        gates = {k: g if isinstance(g, GateResult) else GateResult(**g)
                 for k, g in self.gates.items()}
        object.__setattr__(self, "gates", gates)

    @property
    def suite_delta(self) -> float | None:
        """Suite score change vs the original in points (negative = worse)."""
        if self.suite_score is None or self.suite_score_ref is None:
            return None
        return self.suite_score - self.suite_score_ref

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (plans, ``--json`` output)."""
        return {**asdict(self), "suite_delta": self.suite_delta}

    def gate_delta(self, name: str) -> float | None:
        """A gate's points change vs the original (negative = worse), None if not measured."""
        g = self.gates.get(name)
        return None if g is None else g.delta


def as_module(model: nn.Module | LoadedModel) -> nn.Module:
    """The nn.Module of a model given as one or as a LoadedModel."""
    return getattr(model, "model", model) if not isinstance(model, nn.Module) else model


class HasReference(Protocol):
    """An evaluator of the original model: its reference log-probs, at least."""

    reference: ReferenceLogprobs


def original_quality(evaluator: HasReference, *, slices: bool = True) -> QualityResult:
    """What ``evaluator.evaluate`` returns for the original model itself, known without a
    pass: KL 0 (exactly, as a pass gives it: the same fp16 log-probs), the reference's
    perplexity, suite and gate scores, and KL 0 on every slice. For a ``QualityEvaluator``
    or a ``StreamedEvaluator`` (which has no suite, slices or gates)."""
    ref = evaluator.reference
    suite_ref = getattr(evaluator, "suite_reference", None)
    slice_ref = getattr(evaluator, "slice_reference", None)
    suite = suite_ref.score if suite_ref else None
    gates = {name: GateResult(score, score, dict(detail))
             for name, (score, detail) in getattr(evaluator, "gate_references", {}).items()}
    return QualityResult(
        ppl=ref.ppl, ppl_ref=ref.ppl, kl=0.0, n_tokens=int(ref.tokens.numel()), seconds=0.0,
        suite_score=suite.score if suite else None,
        suite_score_ref=suite.score if suite else None,
        suite_agreement=suite.agreement if suite else None,
        slices={s.name: 0.0 for s in slice_ref.slices.slices} if slices and slice_ref else {},
        gates=gates)


class QualityEvaluator:
    """Perplexity, KL to the original and the optional prompt suite, for any model.

    Args:
        reference_model: the original model (nn.Module or LoadedModel), in eval mode.
        eval_tokens: int64 [n_blocks, seq_len] (``load_text_dataset(...).eval``).
        suite: a tokenized ``PromptSuite`` (``load_suite``), or None.
        batch_size: blocks per forward pass (memory ~ batch x seq_len x vocab x 8 bytes).
        max_new_tokens: length of the original's greedy continuations for suite agreement.
        slices: the KL slices (``quality.slices.build_slices``), or None.
        gates: further checks scored against the original (``Gate``).
    """

    def __init__(self, reference_model: nn.Module | LoadedModel, eval_tokens: torch.Tensor, *,
                 suite: PromptSuite | None = None, batch_size: int = 4,
                 max_new_tokens: int = 16, reference: ReferenceLogprobs | None = None,
                 slices: SliceSet | None = None, gates: Sequence[Gate] = ()) -> None:
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.gates = tuple(gates)
        t0 = time.perf_counter()
        self._capture(as_module(reference_model), eval_tokens, suite, slices, reference)
        self.setup_seconds = time.perf_counter() - t0

    def _capture(self, model: nn.Module, eval_tokens: torch.Tensor, suite: PromptSuite | None,
                 slices: SliceSet | None, reference: ReferenceLogprobs | None = None) -> None:
        """What candidates are compared with, measured on ``model``: its log-probs (unless
        given), its suite continuations and score, its slice log-probs and its gate scores."""
        self.reference = reference or reference_pass(model, eval_tokens,
                                                     batch_size=self.batch_size)
        self.suite_reference = (suite_reference(model, suite, max_new_tokens=self.max_new_tokens)
                                if suite is not None else None)
        self.slice_reference = slice_reference(model, slices) if slices is not None else None
        self.gate_references = {g.name: g.score(model) for g in self.gates}

    @property
    def ppl_ref(self) -> float:
        return self.reference.ppl

    def rebased(self, model: nn.Module) -> QualityEvaluator:
        """A copy of this evaluator that measures against ``model`` instead of the original:
        every reference (log-probs, suite, slices, gates) computed again on it, on the same
        tokens; anything else it holds (a MemoryEvaluator's model, whose compressed copies
        are the candidates) is shared."""
        new = copy.copy(self)
        with torch.no_grad():
            new._capture(model, self.reference.tokens,
                         self.suite_reference.suite if self.suite_reference else None,
                         self.slice_reference.slices if self.slice_reference else None)
        return new

    @property
    def has_slices(self) -> bool:
        """Whether this evaluator was built with the KL slices."""
        return self.slice_reference is not None

    def slice_kl(self, model: Any) -> dict[str, float]:
        """KL per slice of ``model`` alone ({} without slices): what ``evaluate(model,
        slices=False)`` left out, for the one measurement that reports it."""
        return slice_kl(as_module(model), self.slice_reference) if self.slice_reference else {}

    def evaluate(self, model: Any, *, slices: bool = True,
                 kl_limit: float | None = None) -> QualityResult:
        """Measure ``model`` (nn.Module or LoadedModel) against the captured original
        (``slices=False``: without the KL slices, which cost about as much as the rest).
        ``kl_limit``: stop as soon as the KL is certain to exceed it
        (``metrics.bounded_compare_pass``; the result says ``stopped_early``)."""
        m = as_module(model)
        t0 = time.perf_counter()
        nll, kl, blocks = bounded_compare_pass(m, self.reference, batch_size=self.batch_size,
                                               kl_limit=kl_limit)
        if blocks < self.reference.tokens.shape[0]:
            return QualityResult(
                ppl=math.exp(nll), ppl_ref=self.reference.ppl, kl=kl,
                n_tokens=int(self.reference.tokens.numel()),
                seconds=time.perf_counter() - t0, stopped_early=True)
        suite = score_suite(m, self.suite_reference) if self.suite_reference else None
        ref_score = self.suite_reference.score.score if self.suite_reference else None
        per_slice = self.slice_kl(m) if slices else {}
        gates = {}
        for g in self.gates:
            score, detail = g.score(m)
            gates[g.name] = GateResult(score, self.gate_references[g.name][0], detail)
        return QualityResult(
            ppl=math.exp(nll), ppl_ref=self.reference.ppl, kl=kl,
            n_tokens=int(self.reference.tokens.numel()), seconds=time.perf_counter() - t0,
            suite_score=suite.score if suite else None, suite_score_ref=ref_score,
            suite_agreement=suite.agreement if suite else None, slices=per_slice, gates=gates,
        )


__all__ = ["Gate", "GateResult", "HasReference", "QualityEvaluator", "QualityResult",
           "as_module", "original_quality"]
