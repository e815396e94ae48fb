"""Perplexity and KL to the original, one decoder block at a time.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autoplan.compress import CompressionSettings, audit_digests, compress_linear
from autoplan.errors import AutoplanError, UserInputError
from autoplan.formats import Choice
from autoplan.models.graph import get_linear, set_module
from autoplan.models.head import chunk_rows, head_chunks
from autoplan.quality.evaluator import QualityResult
from autoplan.quality.metrics import ReferenceLogprobs, block_terms, check_tokens
from autoplan.quant import HessianAccumulator
from autoplan.quant.kv_cache import KvAmax, KvQuant, kv_hooks
from autoplan.sensitivity.executor import Executor
from autoplan.streaming.candidates import (
    CandidateTask,
    Evaluator,
    Measured,
    Stats,
    with_long_context,
)
from autoplan.streaming.skeleton import StreamedModel


@dataclass(frozen=True)
class StreamedCandidate:
    """One model to measure: per-layer decisions, whether its compression needs the
    calibration Hessians (Wanda/SparseGPT masks, GPTQ), and its simulated KV cache per
    block (``quant.kv_cache``; absent blocks keep the model's own)."""

    decisions: Mapping[str, Choice]
    needs_stats: bool = False
    kv: Mapping[int, KvQuant] | None = None


@dataclass(frozen=True)
class StreamedContext:
    """What a worker needs to measure candidates itself (`evaluate_group`): the checkpoint it
    streams (a path every worker can read: this machine, or storage the cluster shares), the
    evaluation and calibration tokens, the original's reference log-probs (computed once, by
    the driver) and how layers are compressed."""

    folder: Path
    device_type: str  # "cpu" or "cuda": a Ray GPU worker sees its own GPU as cuda:0
    trust_remote_code: bool
    eval_tokens: Tensor
    calib_batches: tuple[Tensor, ...]
    reference: ReferenceLogprobs
    batch_size: int
    settings: CompressionSettings
    baseline: Choice | None

    @property
    def key(self) -> tuple:
        return (str(self.folder), self.device_type, self.reference.nll,
                tuple(self.eval_tokens.shape), len(self.calib_batches), self.batch_size)


_WORKER_EVALUATORS: dict[tuple, StreamedEvaluator] = {}  # per process: reused across tasks


def evaluate_group(ctx: StreamedContext, group: Sequence[StreamedCandidate]
                   ) -> list[tuple[QualityResult, dict[str, dict[str, str]]]]:
    """`StreamedEvaluator.evaluate_many` of `group` in whatever process runs this (a Ray
    worker): the worker opens the checkpoint itself, once, and keeps it for its next tasks."""
    from autoplan.streaming.device import resolve_device

    ev = _WORKER_EVALUATORS.get(ctx.key)
    if ev is None:
        _WORKER_EVALUATORS.clear()  # one model per worker
        sm = StreamedModel(ctx.folder, device=resolve_device(ctx.device_type),
                           trust_remote_code=ctx.trust_remote_code)
        ev = StreamedEvaluator(sm, ctx.eval_tokens, calib_batches=ctx.calib_batches,
                               batch_size=ctx.batch_size, reference=ctx.reference)
        _WORKER_EVALUATORS[ctx.key] = ev
    return ev.evaluate_many(group, ctx.settings, baseline=ctx.baseline)


@dataclass
class _Track:
    """A candidate's progress through the blocks."""

    decided: dict[str, Choice]
    needs_stats: bool
    states: list[Tensor]
    audit: dict[str, dict[str, str]]
    kv: Mapping[int, KvQuant]


class StreamedEvaluator:
    """`QualityEvaluator` for a `StreamedModel`: models are given as per-layer decisions.

    Args:
        sm: the streamed original model.
        eval_tokens: int64 [n_blocks, seq_len].
        calib_batches: token batches the calibration statistics are taken on.
        batch_size: evaluation blocks per forward pass.
    """

    def __init__(self, sm: StreamedModel, eval_tokens: Tensor, *,
                 calib_batches: Sequence[Tensor] = (), suite: Any = None,
                 batch_size: int = 4, reference: ReferenceLogprobs | None = None) -> None:
        if suite is not None:
            raise UserInputError("a suite budget generates text token by token, which streamed "
                                 "execution does not do: use --execution memory, or a kl/ppl "
                                 "budget")
        self.sm = sm
        self.batch_size = batch_size
        t0 = time.perf_counter()
        tokens = check_tokens(eval_tokens)
        self.calib_batches = tuple(calib_batches)
        self._batches = list(tokens.split(batch_size))
        with sm.embeddings():  # loaded once here; verification never needs it again
            evals = [sm.block_inputs(b) for b in self._batches]
            cal = [sm.block_inputs(b) for b in calib_batches]
        self._eval_in = [h for h, _ in evals]
        self._eval_kw = [kw for _, kw in evals]
        self._cal_in = [h for h, _ in cal]
        self._cal_kw = [kw for _, kw in cal]
        # the reference pass's log-probs, written chunk by chunk (fp16, host)
        self._kept: Tensor | None = None
        if reference is None:
            reference = self._reference_pass(tokens, StreamedCandidate({}),
                                             CompressionSettings(), None)
        elif not torch.equal(reference.tokens, tokens):
            raise UserInputError("the reference log-probs were computed on other tokens")
        self.reference = reference
        self.suite_reference = None
        self._kv_amax: dict[int, KvAmax] | None = None
        self.setup_seconds = time.perf_counter() - t0

    @property
    def ppl_ref(self) -> float:
        return self.reference.ppl

    def _reference_pass(self, tokens: Tensor, candidate: StreamedCandidate,
                        settings: CompressionSettings, baseline: Choice | None
                        ) -> ReferenceLogprobs:
        """The log-probs of the original with ``candidate``'s decisions applied, on
        ``tokens`` (the evaluation blocks): one streamed pass, kept as fp16 on the host."""
        self._kept = torch.empty((*tokens.shape, self.sm.config.vocab_size),
                                 dtype=torch.float16)
        try:
            nll, _kl, _audit = self._run([candidate], settings, baseline, keep=True)[0]
            lps = self._kept
        finally:
            self._kept = None
        return ReferenceLogprobs(tokens, lps, nll / (tokens.shape[0] * (tokens.shape[1] - 1)))

    def context(self, settings: CompressionSettings, baseline: Choice | None
                ) -> StreamedContext:
        """What another process needs to measure candidates as this evaluator does."""
        return StreamedContext(self.sm.folder, self.sm.device.type, self.sm.trust_remote_code,
                               self.reference.tokens, self.calib_batches, self.reference,
                               self.batch_size, settings, baseline)

    def _stats(self, i: int, names: list[str], states: list[Tensor], full: bool
               ) -> tuple[dict[str, HessianAccumulator], list[Tensor]]:
        """Input Hessians of block i's `names` on the calibration states (only their
        diagonals unless `full`), and the block's outputs (the next block's calibration
        states)."""
        model = self.sm.model
        stats = {n: HessianAccumulator(get_linear(model, n).in_features, full=full)
                 for n in names}
        handles = [get_linear(model, n).register_forward_hook(
            lambda _m, inp, _o, n=n: stats[n].add(inp[0])) for n in names]
        try:
            out = [self.sm.run_block(i, h, kw) for h, kw in zip(states, self._cal_kw)]
        finally:
            for h in handles:
                h.remove()
        return stats, out

    def _swap_in(self, track: _Track, names: list[str],
                 stats: Mapping[str, HessianAccumulator] | None,
                 settings: CompressionSettings, memo: dict) -> dict:
        """Put `track`'s compressed versions of `names` into the model (compressing each
        (layer, choice) once per block for every candidate); returns the originals."""
        old = {}
        for n in names:
            key = (n, track.decided[n], track.needs_stats)
            if key not in memo:
                sim = compress_linear(get_linear(self.sm.model, n), track.decided[n],
                                      stats.get(n) if stats and track.needs_stats else None,
                                      settings)
                memo[key] = (sim, audit_digests({n: sim})[n])
            sim, digest = memo[key]
            old[n] = set_module(self.sm.model, n, sim)
            track.audit[n] = digest
        return old

    def _restore(self, old: dict) -> None:
        for n, module in old.items():
            set_module(self.sm.model, n, module)

    def _head_stats(self, names: list[str], states: list[Tensor], full: bool
                    ) -> dict[str, HessianAccumulator]:
        sm = self.sm
        stats = {n: HessianAccumulator(get_linear(sm.model, n).in_features, full=full)
                 for n in names}
        for h in states:
            x = sm.base.norm(h)
            for n in names:
                stats[n].add(x)
        return stats

    @torch.no_grad()
    def _run(self, candidates: Sequence[StreamedCandidate], settings: CompressionSettings,
             baseline: Choice | None, *, keep: bool = False,
             reference: ReferenceLogprobs | None = None
             ) -> list[tuple[float, float, dict[str, dict[str, str]]]]:
        """(summed NLL, summed KL, audit digests) per candidate, in one pass over the blocks."""
        sm = self.sm
        tracks = [_Track({n: c for n, c in cand.decisions.items()
                          if baseline is None or c != baseline}, cand.needs_stats,
                         list(self._eval_in), {}, dict(cand.kv or {})) for cand in candidates]
        want_stats = any(t.needs_stats and t.decided for t in tracks)
        h_cal = list(self._cal_in) if want_stats else []
        for i in range(sm.n_blocks):
            keys = set(sm.block_keys[i])
            names = [[n for n in t.decided if f"{n}.weight" in keys] for t in tracks]
            with sm.resident(i):
                stats = None
                if want_stats:
                    union = sorted({n for t, ns in zip(tracks, names) if t.needs_stats
                                    for n in ns})
                    stats, h_cal = self._stats(i, union, h_cal, settings.needs_hessian)
                memo: dict = {}
                for t, ns in zip(tracks, names):
                    old = self._swap_in(t, ns, stats, settings, memo)
                    hooks = {i: t.kv[i]} if i in t.kv else {}
                    try:
                        with kv_hooks(sm.model, hooks):
                            t.states = [sm.run_block(i, h, kw)
                                        for h, kw in zip(t.states, self._eval_kw)]
                    finally:
                        self._restore(old)
                del memo, stats
        in_blocks = {k for ks in sm.block_keys for k in ks}
        out = []
        with sm.head_resident():
            heads = [[n for n in t.decided if f"{n}.weight" not in in_blocks] for t in tracks]
            union = sorted({n for t, ns in zip(tracks, heads) if t.needs_stats for n in ns})
            stats = self._head_stats(union, h_cal, settings.needs_hessian) if union else None
            memo = {}
            for t, ns in zip(tracks, heads):
                old = self._swap_in(t, ns, stats, settings, memo)
                nlls, kls = [], []
                try:
                    rows = chunk_rows(sm.config.vocab_size)
                    for j, (h, batch) in enumerate(zip(t.states, self._batches)):
                        i0 = j * self.batch_size
                        span = slice(i0, i0 + batch.shape[0])
                        nll, kl = block_terms(
                            head_chunks(sm.logits, h, rows), batch,
                            None if reference is None else reference.logprobs[span],
                            keep=self._kept[span] if keep and self._kept is not None
                            else None)
                        nlls += nll
                        kls += kl
                finally:
                    self._restore(old)
                t.states = []
                out.append((math.fsum(nlls), math.fsum(kls), dict(sorted(t.audit.items()))))
        return out

    @torch.no_grad()
    def kv_amax(self) -> dict[int, KvAmax]:
        """The largest |K| and |V| each block's attention sees on the calibration batches,
        through the ORIGINAL blocks (one streamed pass, kept): the static KV scales' input,
        as ``quant.kv_cache.calibrate_kv`` takes it in memory."""
        if self._kv_amax is None:
            sm, amax = self.sm, {}
            states = list(self._cal_in)
            for i in range(sm.n_blocks):
                amax[i] = KvAmax()
                with sm.resident(i), kv_hooks(sm.model, {i: amax[i]}):
                    states = [sm.run_block(i, h, kw) for h, kw in zip(states, self._cal_kw)]
            self._kv_amax = amax
        return self._kv_amax

    has_slices = False  # the slices' positions need whole-model passes
    in_memory = False  # no streamed recovery pass exists

    def measure(self, tasks: Sequence[CandidateTask], settings: CompressionSettings,
                baseline: Choice, stats: Stats, executor: Executor | None,
                long: Evaluator | None = None) -> Iterator[Measured]:
        """The `Evaluator` protocol: candidates compressed block by block on the fly, a group
        of them per pass over the blocks (each block read once, its Hessians taken once; the
        calibration statistics are taken here, per block, so `stats` is not used). In this
        process: one group. On a distributed executor: one group per worker, each worker
        streaming the checkpoint itself (the model is never shipped; the reference
        log-probs are, once). With `long` (a compressed KV cache): in this process, the
        long-prompt split measured by it as well."""
        cands = [StreamedCandidate(t.decisions, t.use_stats, t.kv) for t in tasks]
        if long is not None:
            longs = dict(long.measure(tasks, settings, baseline, stats, None))
            short = self.evaluate_many(cands, settings, baseline=baseline)
            yield from ((i, (with_long_context(q, longs[i][0]), a))
                        for i, (q, a) in enumerate(short))
            return
        n = getattr(executor, "workers", 1) if executor is not None else 1
        if executor is None or n <= 1 or len(cands) <= 1:
            yield from enumerate(self.evaluate_many(cands, settings, baseline=baseline))
            return
        groups = [list(range(g, len(cands), n)) for g in range(min(n, len(cands)))]
        done = executor.imap_unordered(partial(evaluate_group, self.context(settings, baseline)),
                                       [[cands[i] for i in g] for g in groups])
        for gi, results in done:
            yield from zip(groups[gi], results, strict=True)

    def measure_slices(self, task: CandidateTask, settings: CompressionSettings,
                       baseline: Choice, stats: Stats) -> dict[str, float]:
        raise AutoplanError("streamed execution measures no KL slices (has_slices is False)")

    def with_reference(self, decisions: Mapping[str, Choice], settings: CompressionSettings,
                       baseline: Choice) -> StreamedEvaluator:
        """The `Evaluator` protocol: the new reference's log-probs from one streamed pass of
        the original with ``decisions`` applied."""
        new = copy.copy(self)
        new.reference = new._reference_pass(self.reference.tokens, StreamedCandidate(decisions),
                                            settings, baseline)
        return new

    def evaluate(self, model: torch.nn.Module, *, slices: bool = True) -> QualityResult:
        raise AutoplanError("a streamed evaluator measures decisions, not a model in memory: "
                            "pass --execution memory")

    def evaluate_many(self, candidates: Sequence[StreamedCandidate],
                      settings: CompressionSettings, *, baseline: Choice | None = None
                      ) -> list[tuple[QualityResult, dict[str, dict[str, str]]]]:
        """Quality of the original with each candidate's decisions applied, and its audit
        digests, measured in one pass over the blocks."""
        if not candidates:
            return []
        t0 = time.perf_counter()
        ref = self.reference
        runs = self._run(candidates, settings, baseline, reference=ref)
        each = (time.perf_counter() - t0) / len(candidates)
        n_targets = ref.tokens.shape[0] * (ref.tokens.shape[1] - 1)
        return [(QualityResult(ppl=math.exp(nll / n_targets), ppl_ref=ref.ppl,
                               kl=kl / ref.tokens.numel(), n_tokens=int(ref.tokens.numel()),
                               seconds=each), audit)
                for nll, kl, audit in runs]

    def evaluate_decisions(self, decisions: Mapping[str, Choice], settings: CompressionSettings,
                           *, baseline: Choice | None = None, needs_stats: bool = False,
                           kv: Mapping[int, KvQuant] | None = None
                           ) -> tuple[QualityResult, dict[str, dict[str, str]]]:
        """Quality of the original with `decisions` (and a KV cache) applied, and the audit
        digests."""
        return self.evaluate_many([StreamedCandidate(decisions, needs_stats, kv)], settings,
                                  baseline=baseline)[0]


__all__ = ["StreamedCandidate", "StreamedContext", "StreamedEvaluator", "evaluate_group"]
