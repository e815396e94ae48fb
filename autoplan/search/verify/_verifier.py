"""Verification: apply candidate decisions to the real model and measure the budget metric.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from autoplan.compress import CompressionSettings, collect_stats
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.plan import schema as ps
from autoplan.quality.evaluator import QualityResult, original_quality
from autoplan.quant.kv_cache import KvQuant
from autoplan.search.optimize import SearchSpace, Tables
from autoplan.search.verify._budget import QualityBudget
from autoplan.search.verify._calibration import (
    Calibration,
    Observation,
    family_shares,
    fit_calibration,
)
from autoplan.search.verify._measurement_cache import MeasurementStore
from autoplan.sensitivity.executor import Executor
from autoplan.streaming.candidates import CandidateTask, Evaluator, Measured
from autoplan.streaming.device import is_out_of_memory


@dataclass(frozen=True)
class RecoveredCandidate:
    """A recovered measurement's record: the plan's `recovery` section, its weights file."""

    record: ps.Recovery
    weights_file: Path


@dataclass(frozen=True)
class Measurement:
    picks: tuple[int, ...]
    label: str
    quality: QualityResult
    surrogate: float
    badness: float
    passed: bool
    audit: dict[str, dict[str, str]]
    recovery: RecoveredCandidate | None = None  # --recover: what the recovery pass did


@dataclass(frozen=True)
class KvSimulation:
    """A compressed KV cache every candidate of a search runs with (quant/kv_cache.py):
    its label (part of each measurement's key), each block's rounding, and the evaluator
    of the long-prompt split (with the long-context gate) it is measured on as well."""

    label: str
    quants: dict[int, KvQuant]
    long_evaluator: Evaluator | None = None


def decisions_key(decisions: dict[str, Choice], baseline: Choice, kv: str = "",
                  frame: str = "") -> tuple:
    """What a measurement depends on besides the shared model, tokens and settings: the
    layers compressed (those not at the baseline), the baseline itself, when the KV cache
    is compressed its format (``KvSimulation.label``) and, when quality is not measured
    against the checkpoint as loaded, what it is measured against (``AsIs.frame``)."""
    key = (str(baseline), tuple(sorted((n, str(c)) for n, c in decisions.items()
                                       if c != baseline)))
    if frame:
        return (*key, kv, frame)
    return (*key, kv) if kv else key


def is_original(key: tuple) -> bool:
    """A measurement key of the uncompressed model (no layer, no KV cache compressed)."""
    return not key[1] and len(key) == 2


@dataclass
class SharedMeasurements:
    """Measurements by decisions, shared by the verifiers of several platforms that search
    one model with one budget and compression settings (`autoplan compare`): two platforms
    whose candidates compress the same layers the same way measure them once. With a
    `store`, also by earlier runs (`measurement_cache`): read there when not held here, and
    every new one written there."""

    results: dict[tuple, tuple[QualityResult, dict]] = field(default_factory=dict)
    stats: dict[tuple[str, ...], dict] = field(default_factory=dict)  # by layer names
    measured: int = 0  # candidates measured on the real model in this run
    reused: int = 0  # requests answered by another platform's measurement
    cached: int = 0  # requests answered by an earlier run's (`store`)
    store: MeasurementStore | None = None

    def get(self, key: tuple) -> tuple[tuple[QualityResult, dict] | None, bool]:
        """The measurement held for `key` (None: none), and whether it came from disk."""
        hit = self.results.get(key)
        if hit is not None or self.store is None:
            return hit, False
        hit = self.store.get(key)
        return hit, hit is not None

    def put(self, key: tuple, quality: QualityResult, audit: dict) -> None:
        self.results[key] = (quality, audit)
        if self.store is not None:
            self.store.put(key, quality, audit)


class RecoveryHook(Protocol):
    """What `--recover` plugs into the Verifier (search.recovery.RecoveryStage)."""

    def measure(self, verifier: Verifier, m: Measurement) -> Measurement:
        """``m``'s candidate measured again after its recovery pass."""


@dataclass
class Verifier:
    model: torch.nn.Module
    space: SearchSpace
    tables: Tables
    evaluator: Evaluator
    budget: QualityBudget
    settings: CompressionSettings
    calib_batches: Sequence[torch.Tensor]
    measured: dict[tuple[int, ...], Measurement] = field(default_factory=dict)
    # what to raise when a measurement runs out of memory (ModelRunner.out_of_memory)
    out_of_memory: Callable[[str], Exception] | None = None
    shared: SharedMeasurements | None = None
    recovery: RecoveryHook | None = None  # --recover: re-measures after a recovery pass
    # further budgets every passing candidate must also meet (the search steers on `budget`)
    also: tuple[QualityBudget, ...] = ()
    # the compressed KV cache every candidate runs with (None: the model's own)
    kv: KvSimulation | None = None
    # what the evaluator's reference is when not the checkpoint as loaded (AsIs.frame)
    frame: str = ""
    _stats: dict | None = None

    @property
    def count(self) -> int:
        return len(self.measured)

    def decisions(self, picks: Sequence[int]) -> dict[str, Choice]:
        return self.space.decisions(self.tables.choices_of(picks))

    def _calibration_stats(self) -> dict:
        if self._stats is None:
            names = [la.name for u in self.space.units for la in u.layers]
            cached = self.shared.stats.get(tuple(names)) if self.shared else None
            self._stats = cached or collect_stats(self.model, names, self.calib_batches,
                                                  full=self.settings.needs_hessian)
            if self.shared is not None:
                self.shared.stats[tuple(names)] = self._stats
        return self._stats

    @property
    def slices_decide(self) -> bool:
        """A budget names a slice: every measurement needs the KL slices to pass or fail."""
        return any(b.metric == "slice" for b in (self.budget, *self.also))

    @property
    def kl_limit(self) -> float | None:
        """The tightest KL budget (None without one): a candidate certain to exceed it fails
        whatever the rest of its measurement would say."""
        limits = [b.limit for b in (self.budget, *self.also) if b.metric == "kl"]
        return min(limits) if limits else None

    def _task(self, key: tuple[int, ...], slices: bool | None = None,
              bounded: bool = False) -> CandidateTask:
        decisions = self.decisions(key)
        # Calibration statistics are needed only for Wanda/SparseGPT masks and GPTQ.
        needs = self.settings.quant_method == "gptq" or any(
            c.sparsity.kind != "dense" and c != self.space.baseline for c in decisions.values())
        return CandidateTask(decisions, needs, self.slices_decide if slices is None else slices,
                             self.kl_limit if bounded else None,
                             self.kv.quants if self.kv is not None else None)

    def _results(self, tasks: list[CandidateTask], executor: Executor | None
                 ) -> Iterator[Measured]:
        """(task index, (quality, audit)) per task, in completion order."""
        return self.evaluator.measure(tasks, self.settings, self.space.baseline,
                                      self._calibration_stats, executor,
                                      long=self.kv.long_evaluator if self.kv else None)

    def measure(self, picks: Sequence[int], label: str, *, bounded: bool = False
                ) -> Measurement:
        return self.measure_many([(picks, label)], bounded=bounded)[0]

    def passes(self, quality: QualityResult) -> bool:
        """The budget and every further budget met."""
        return self.budget.passes(quality) and all(b.passes(quality) for b in self.also)

    def measure_many(self, candidates: Sequence[tuple[Sequence[int], str]],
                     executor: Executor | None = None,
                     on_done: Callable[[int], None] | None = None,
                     recover: bool = False, bounded: bool = False) -> list[Measurement]:
        """Measure each (picks, label) not measured yet, on `executor` (serial by default);
        returns the measurements in the order given. With `recover` and a recovery stage,
        each new measurement is then replaced by the one after its recovery pass.
        `bounded`: only whether it passes matters, so a pass stops as soon as the KL budget
        is certain to be exceeded (in memory; a streamed pass measures every block). Such a
        measurement is `stopped_early`: a lower bound to the surrogate's calibration."""
        keys = [tuple(p) for p, _ in candidates]
        labels = dict(zip(keys, (lb for _, lb in candidates), strict=True))
        todo = [k for k in dict.fromkeys(keys) if k not in self.measured
                or (not bounded and self.measured[k].quality.stopped_early)]
        new = list(todo)  # measured here or for another platform: each recovered below
        if recover:
            self.check_recoverable()  # before any measurement
        done = 0
        if self.shared is not None:  # measured already (another platform, an earlier run)
            for k in list(todo):
                hit, from_disk = self.shared.get(self._shared_key(k))
                if hit is not None and self._answers(hit[0], bounded):
                    todo.remove(k)
                    self.record(k, labels[k], *hit)
                    self.shared.results[self._shared_key(k)] = hit
                    self.shared.cached += from_disk
                    self.shared.reused += not from_disk
                    done += 1
                    if on_done:
                        on_done(done)
        for k in list(todo):  # nothing compressed: the original, known without a pass
            if is_original(self._shared_key(k)):
                todo.remove(k)
                self.record(k, labels[k], original_quality(self.evaluator), {})
                done += 1
                if on_done:
                    on_done(done)
        tasks = [self._task(k, bounded=bounded) for k in todo]
        try:
            for n, (i, (quality, audit)) in enumerate(self._results(tasks, executor),
                                                      start=done + 1):
                key = todo[i]
                self.record(key, labels[key], quality, audit)
                if self.shared is not None:
                    self.shared.put(self._shared_key(key), quality, audit)
                    self.shared.measured += 1
                if on_done:
                    on_done(n)
        except (RuntimeError, MemoryError) as exc:
            if self.out_of_memory is None or not is_out_of_memory(exc):
                raise
            raise self.out_of_memory("verifying candidates") from None
        if recover:
            self.recover(new)
        return [self.measured[k] for k in keys]

    def check_recoverable(self) -> None:
        """Refuse a recovery stage on a streamed model: a pass trains the whole compressed
        model beside the original in memory, and no streamed pass exists (the search refuses
        --recover with --execution stream before loading; this guards every other caller)."""
        if self.recovery is not None and not self.evaluator.in_memory:
            raise UserInputError("--recover needs the model in memory (a streamed recovery "
                                 "pass is not implemented): pass --execution memory")

    def recover(self, keys: Sequence[tuple[int, ...]]) -> None:
        """Replace each of these measurements by the one after its recovery pass (kept as
        it is when the pass diverges); nothing without a recovery stage."""
        if self.recovery is None:
            return
        self.check_recoverable()
        for key in keys:
            self.measured[key] = self.recovery.measure(self, self.measured[key])

    def with_slices(self, m: Measurement) -> Measurement:
        """``m`` with its KL per slice, measured now if it was measured without them (the
        candidate compressed again: the same decisions, statistics and settings give the
        same weights). Kept here and in the shared measurements, so a platform with the
        same decisions does not measure them again. ``m`` itself when it has them, when the
        evaluator has no slices (``--no-slices``, streamed) or after a recovery pass (its
        measurement already ran on the recovered model, slices included)."""
        if m.quality.slices or m.recovery is not None or not self.evaluator.has_slices:
            return m
        shared = self.shared.get(self._shared_key(m.picks))[0] if self.shared else None
        if shared is not None and shared[0].slices:  # another platform's plan: measured
            quality = dataclasses.replace(m.quality, slices=dict(shared[0].slices))
        else:
            quality = self._slices_measured(m)
        kept = self.measured.get(m.picks)
        if kept is not None:
            self.measured[m.picks] = dataclasses.replace(kept, quality=quality)
        if self.shared is not None:
            self.shared.put(self._shared_key(m.picks), quality, m.audit)
        return dataclasses.replace(m, quality=quality)

    def _slices_measured(self, m: Measurement) -> QualityResult:
        """``m``'s quality with the KL slices of its candidate, compressed again."""
        task = self._task(m.picks, slices=True)
        t0 = time.perf_counter()
        try:
            # the same decisions, statistics and settings: the weights it measured
            per_slice = self.evaluator.measure_slices(task, self.settings,
                                                      self.space.baseline,
                                                      self._calibration_stats)
        except (RuntimeError, MemoryError) as exc:
            if self.out_of_memory is None or not is_out_of_memory(exc):
                raise
            raise self.out_of_memory("measuring the KL slices") from None
        return dataclasses.replace(m.quality, slices=per_slice,
                                   seconds=m.quality.seconds + time.perf_counter() - t0)

    def _answers(self, quality: QualityResult, bounded: bool) -> bool:
        """Whether a measurement made elsewhere answers this request: with the KL slices if
        a budget needs them, and, for a pass stopped early, only a request that may stop
        early under a limit its lower bound already exceeds."""
        if self.slices_decide and not quality.slices and not quality.stopped_early:
            return False
        if quality.stopped_early:
            return bounded and self.kl_limit is not None and quality.kl > self.kl_limit
        return True

    def _shared_key(self, picks: tuple[int, ...]) -> tuple:
        return decisions_key(self.decisions(picks), self.space.baseline,
                             self.kv.label if self.kv is not None else "", self.frame)

    def record(self, picks: Sequence[int], label: str, quality: QualityResult,
               audit: dict[str, dict[str, str]]) -> Measurement:
        """Keep a measurement (made here, by another process of the search, or for another
        platform of a compare)."""
        key = tuple(picks)
        badness = self.budget.badness(quality)
        self.measured[key] = Measurement(key, label, quality, self.tables.surrogate(key),
                                         badness, self.passes(quality), audit)
        return self.measured[key]

    def calibration(self, prior: float, leave_out: Sequence[tuple[int, ...]] = ()
                    ) -> Calibration:
        """The surrogate calibrated per format family from every measurement so far (a pass
        stopped early as a lower bound), but those in `leave_out` (_calibration.py). With a
        recovery stage, only the measurements taken after a recovery pass: the uniform
        recipes, measured unrecovered, would mix two relations into one."""
        skip = {tuple(p) for p in leave_out}
        return fit_calibration(
            [Observation(family_shares(self.tables, key), m.badness, m.quality.stopped_early)
             for key, m in self.measured.items() if key not in skip
             and (self.recovery is None or m.recovery is not None)], prior)

__all__ = ["KvSimulation", "Measurement", "RecoveredCandidate", "RecoveryHook",
           "SharedMeasurements", "Verifier", "decisions_key", "is_original"]
