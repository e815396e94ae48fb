"""Perplexity and KL to the original, one decoder block at a time.

The original's log-probabilities over the evaluation split are computed once (a streamed
pass) and kept as `quality.metrics.ReferenceLogprobs` (full vocabulary, fp16: see that
module for why not top-k). A compressed model is never materialized: each block is loaded,
its decided layers are compressed on the fly with `compress.compress_linear` (the
SimulatedLinear code every path uses), the evaluation states go through it, and the original
weights go back to disk. Calibration statistics (the input Hessians that Wanda, SparseGPT and
GPTQ need) come from the ORIGINAL block on the calibration states, for the resident block
only, exactly as `compress.collect_stats` computes them for the whole model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from autoplan.compress import CompressionSettings, audit_digests, compress_linear
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models.graph import get_linear, set_module
from autoplan.quality.evaluator import QualityResult
from autoplan.quality.metrics import ReferenceLogprobs, check_tokens, kl_sum, nll_sum
from autoplan.quant import HessianAccumulator
from autoplan.streaming.skeleton import StreamedModel


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
                 batch_size: int = 4) -> None:
        if suite is not None:
            raise UserInputError("a suite budget generates text token by token, which streamed "
                                 "execution does not do: use --execution memory, or a kl/ppl "
                                 "budget")
        self.sm = sm
        self.batch_size = batch_size
        self.calib_batches = list(calib_batches)
        t0 = time.perf_counter()
        tokens = check_tokens(eval_tokens)
        nll, _kl, lps, _ = self._run(tokens, {}, None, CompressionSettings(), keep=True)
        n_targets = tokens.shape[0] * (tokens.shape[1] - 1)
        self.reference = ReferenceLogprobs(tokens, torch.cat(lps), nll / n_targets)
        self.suite_reference = None
        self.setup_seconds = time.perf_counter() - t0

    @property
    def ppl_ref(self) -> float:
        return self.reference.ppl

    def _stats(self, i: int, names: list[str], states: list[Tensor],
               kwargs: list[dict]) -> tuple[dict[str, HessianAccumulator], list[Tensor]]:
        """Input Hessians of block i's `names` on the calibration states, and the block's
        outputs (the next block's calibration states)."""
        model = self.sm.model
        stats = {n: HessianAccumulator(get_linear(model, n).in_features) for n in names}
        handles = [get_linear(model, n).register_forward_hook(
            lambda _m, inp, _o, n=n: stats[n].add(inp[0])) for n in names]
        try:
            out = [self.sm.run_block(i, h, kw) for h, kw in zip(states, kwargs)]
        finally:
            for h in handles:
                h.remove()
        return stats, out

    def _compressed(self, names: list[str], decisions: Mapping[str, Choice],
                    stats: Mapping[str, HessianAccumulator] | None,
                    settings: CompressionSettings, swapped: dict) -> dict:
        old = {}
        for n in names:
            sim = compress_linear(get_linear(self.sm.model, n), decisions[n],
                                  stats.get(n) if stats else None, settings)
            old[n] = set_module(self.sm.model, n, sim)
            swapped[n] = sim
        return old

    def _restore(self, old: dict) -> None:
        for n, module in old.items():
            set_module(self.sm.model, n, module)

    @torch.no_grad()
    def _run(self, tokens: Tensor, decisions: Mapping[str, Choice], baseline: Choice | None,
             settings: CompressionSettings, *, needs_stats: bool = False, keep: bool = False,
             reference: ReferenceLogprobs | None = None):  # noqa: ANN202 - private
        sm = self.sm
        decided = {n: c for n, c in decisions.items() if baseline is None or c != baseline}
        batches = list(tokens.split(self.batch_size))
        evals = [sm.block_inputs(b) for b in batches]
        h_eval, kw_eval = [h for h, _ in evals], [kw for _, kw in evals]
        h_cal: list[Tensor] = []
        kw_cal: list[dict] = []
        if needs_stats:
            cal = [sm.block_inputs(b) for b in self.calib_batches]
            h_cal, kw_cal = [h for h, _ in cal], [kw for _, kw in cal]
        swapped: dict = {}
        for i in range(sm.n_blocks):
            names = [n for n in decided if f"{n}.weight" in sm.block_keys[i]]
            with sm.resident(i):
                stats = None
                if needs_stats:
                    stats, h_cal = self._stats(i, names, h_cal, kw_cal)
                old = self._compressed(names, decided, stats, settings, swapped)
                try:
                    h_eval = [sm.run_block(i, h, kw) for h, kw in zip(h_eval, kw_eval)]
                finally:
                    self._restore(old)
        head = [n for n in decided if not any(f"{n}.weight" in k for k in sm.block_keys)]
        stats = None
        if head and needs_stats:
            stats = {n: HessianAccumulator(get_linear(sm.model, n).in_features) for n in head}
            for h in h_cal:
                x = sm.base.norm(h)
                for n in head:
                    stats[n].add(x)
        old = self._compressed(head, decided, stats, settings, swapped)
        nll, kl, lps = 0.0, 0.0, []
        try:
            for j, (h, batch) in enumerate(zip(h_eval, batches)):
                lp = torch.log_softmax(sm.logits(h).float(), dim=-1)
                batch = batch.to(lp.device)
                nll += nll_sum(lp, batch)
                if reference is not None:
                    i0 = j * self.batch_size
                    kl += kl_sum(reference.logprobs[i0:i0 + batch.shape[0]].to(lp.device), lp)
                if keep:
                    lps.append(lp.half().cpu())
        finally:
            self._restore(old)
        return nll, kl, lps, swapped

    def evaluate_decisions(self, decisions: Mapping[str, Choice], settings: CompressionSettings,
                           *, baseline: Choice | None = None, needs_stats: bool = False
                           ) -> tuple[QualityResult, dict[str, dict[str, str]]]:
        """Quality of the original with `decisions` applied, and the audit digests."""
        t0 = time.perf_counter()
        ref = self.reference
        nll, kl, _lps, swapped = self._run(ref.tokens, decisions, baseline, settings,
                                           needs_stats=needs_stats, reference=ref)
        n_targets = ref.tokens.shape[0] * (ref.tokens.shape[1] - 1)
        result = QualityResult(ppl=math.exp(nll / n_targets), ppl_ref=ref.ppl,
                               kl=kl / ref.tokens.numel(), n_tokens=int(ref.tokens.numel()),
                               seconds=time.perf_counter() - t0)
        return result, audit_digests(swapped)


__all__ = ["StreamedEvaluator"]
