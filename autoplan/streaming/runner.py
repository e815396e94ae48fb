"""One entry point for both executions: `open_model` loads a model in memory or as a
streamed skeleton (chosen by `--execution`, `auto` by the memory estimate) on `--device`,
and the returned `ModelRunner` profiles, evaluates and verifies it the same way either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from autoplan.compress import CompressionSettings
from autoplan.errors import AutoplanError
from autoplan.models.loader import LoadedModel, load_model, open_checkpoint
from autoplan.modelspec import ModelSpec
from autoplan.sensitivity.executor import Executor
from autoplan.sensitivity.profile import LayerChoices, SensitivityProfile, build_profile
from autoplan.streaming import estimate
from autoplan.streaming.device import device_memory, host_memory, is_out_of_memory, resolve_device
from autoplan.streaming.settings import Execution, ExecutionSettings

if TYPE_CHECKING:
    from autoplan.quality.suite import PromptSuite
    from autoplan.streaming.candidates import Evaluator
    from autoplan.streaming.evaluate import StreamedEvaluator


def pick_execution(spec: ModelSpec, settings: ExecutionSettings, device: torch.device,
                   w: estimate.Workload, needs_memory: str | None = None) -> tuple[str, str]:
    """('memory' | 'stream', why); `needs_memory`: what in the request cannot stream."""
    if settings.execution != "auto":
        return settings.execution, "asked for"
    return estimate.choose(spec, device.type, host_memory(), device_memory(device), w,
                           needs_memory)


@dataclass
class ModelRunner:
    """A loaded model and the execution it runs under."""

    loaded: LoadedModel
    execution: str
    device: torch.device
    why: str
    workload: estimate.Workload
    offload_dir: Path | None = None

    @property
    def streamed(self) -> Any:
        return self.loaded.model if self.execution == "stream" else None

    def out_of_memory(self, what: str, tokens: int) -> AutoplanError:
        """The one-line error for running out of memory while doing `what`."""
        w = dataclasses.replace(self.workload, calib_tokens=tokens)
        p = estimate.plan(self.loaded.spec, self.execution, self.device.type, w)
        gb = 2**30
        fix = "use --execution stream, " if self.execution == "memory" else ""
        return AutoplanError(
            f"out of memory while {what} on --device {self.device} ({self.execution} execution, "
            f"{tokens} calibration tokens); the --dry-run estimate is {p.host / gb:.1f} GiB host"
            f" + {p.gpu / gb:.1f} GiB GPU: {fix}fewer --calib-blocks or another --device (the "
            "profile cache is kept; rerun resumes)")

    def build_profile(self, layers: Sequence[str], choices: LayerChoices,
                      batches: Sequence[Tensor], *, model_hash: str, calib_hash: str,
                      settings: CompressionSettings, cache_dir: Path, seed: int = 0,
                      on_progress: Callable[[int, int], None] | None = None,
                      executor: Executor | None = None) -> SensitivityProfile:
        kw = dict(model_hash=model_hash, calib_hash=calib_hash, settings=settings,
                  cache_dir=cache_dir, seed=seed, on_progress=on_progress, executor=executor)
        try:
            if self.execution == "stream":
                from autoplan.streaming.profile import build_profile_streamed

                return build_profile_streamed(self.loaded.model, layers, choices, batches,
                                              offload_dir=self.offload_dir, **kw)
            return build_profile(self.loaded.model, layers, choices,
                                 [b.to(self.device) for b in batches], **kw)
        except (RuntimeError, MemoryError) as exc:
            if is_out_of_memory(exc):
                raise self.out_of_memory("profiling", sum(b.numel() for b in batches)) from None
            raise

    def build_kv_profile(self, request: Any, batches: Sequence[Tensor], *, model_hash: str,
                         calib_hash: str, settings: CompressionSettings, cache_dir: Path,
                         seed: int = 0) -> SensitivityProfile:
        """Every block scored for the requested KV-cache formats (sensitivity.kv), in memory
        or streamed, into the profile's cache file."""
        kw = dict(model_hash=model_hash, calib_hash=calib_hash, settings=settings,
                  cache_dir=cache_dir, seed=seed)
        try:
            if self.execution == "stream":
                from autoplan.streaming.profile import build_kv_profile_streamed

                return build_kv_profile_streamed(self.loaded.model, request, batches,
                                                 offload_dir=self.offload_dir, **kw)
            from autoplan.sensitivity.kv import build_kv_profile

            return build_kv_profile(self.loaded.model, request,
                                    [b.to(self.device) for b in batches], **kw)
        except (RuntimeError, MemoryError) as exc:
            if is_out_of_memory(exc):
                raise self.out_of_memory("profiling the KV cache",
                                         sum(b.numel() for b in batches)) from None
            raise

    def kv_amax(self, batches: Sequence[Tensor],
                evaluator: StreamedEvaluator | None = None) -> dict:
        """The largest |K| and |V| of every block on the calibration batches (the static KV
        scales' calibration): the streamed evaluator's own pass (`evaluator`, streamed
        only), or one forward in memory."""
        if self.execution == "stream":
            if evaluator is None:
                raise AutoplanError("streamed KV calibration needs the streamed evaluator")
            return evaluator.kv_amax()
        from autoplan.quant.kv_cache import calibrate_kv

        return calibrate_kv(self.loaded.model, [b.to(self.device) for b in batches])

    def reference_key(self, eval_tokens: Tensor) -> str:
        """What the original's log-probs on these tokens depend on (`reference_cache`)."""
        from autoplan.quality.reference_cache import reference_key

        return reference_key(self.loaded.content_hash, eval_tokens, execution=self.execution,
                             device=self.device.type, batch_size=4)

    def evaluator(self, eval_tokens: Tensor, *, calib_batches: Sequence[Tensor] = (),
                  suite: PromptSuite | None = None, cache_dir: Path | None = None,
                  **extra: Any) -> Evaluator:
        """A MemoryEvaluator (memory) or StreamedEvaluator (stream) of the original.

        `extra` (in memory only): further QualityEvaluator arguments (slices, gates).

        With `cache_dir`, the original's reference log-probs are read from there when a
        previous run computed them for the same model, tokens and arithmetic (and stored
        there otherwise): a resumed search does not recompute them.
        """
        from autoplan.quality.metrics import reference_pass
        from autoplan.quality.reference_cache import cached_reference

        def reference(compute: Callable[[], Any]) -> Any:
            if cache_dir is None:
                return None
            return cached_reference(cache_dir, self.reference_key(eval_tokens), eval_tokens,
                                    compute)

        try:
            if self.execution == "stream":
                from autoplan.streaming.evaluate import StreamedEvaluator

                ref = reference(lambda: StreamedEvaluator(
                    self.loaded.model, eval_tokens, calib_batches=()).reference)
                return StreamedEvaluator(self.loaded.model, eval_tokens,
                                         calib_batches=calib_batches, suite=suite,
                                         reference=ref)
            from autoplan.streaming.candidates import MemoryEvaluator

            tokens = eval_tokens.to(self.device)
            ref = reference(lambda: reference_pass(self.loaded.model, tokens, batch_size=4))
            return MemoryEvaluator(self.loaded.model, tokens, suite=suite, reference=ref,
                                   **extra)
        except (RuntimeError, MemoryError) as exc:
            if is_out_of_memory(exc):
                raise self.out_of_memory("measuring the original model",
                                sum(b.numel() for b in calib_batches)) from None
            raise


def open_model(model: str, settings: ExecutionSettings | None = None, *,
               trust_remote_code: bool = False,
               workload: estimate.Workload | None = None,
               needs_memory: str | None = None) -> ModelRunner:
    """Load `model` (alias, HF folder, GGUF) for measurement under `settings`; with
    `needs_memory` (what in the request cannot stream), `auto` keeps the model in memory
    whenever it fits.

    Raises:
        UserInputError: an unknown device, a GPU that is not there, or what `load_model`
            refuses.
    """
    settings = settings or ExecutionSettings()
    device = resolve_device(settings.device)  # a missing GPU is refused before any loading
    w = workload or estimate.Workload()
    folder, source, tokenizer, spec, content_hash = open_checkpoint(
        model, trust_remote_code=trust_remote_code)
    execution, why = pick_execution(spec, settings, device, w, needs_memory)
    try:
        if execution == "memory":
            loaded = load_model(model, trust_remote_code=trust_remote_code)
            loaded.model.to(device)
        else:
            from autoplan.heap import release_kept_memory, return_large_frees_to_os
            from autoplan.streaming.skeleton import StreamedModel

            # fixed thresholds apply to what is allocated from now on; what the heap kept
            # from the work before (hashing, tokenizing) goes back now, or its holes sit
            # under the first block read (measured: a MoE profile with 1.2 GB blocks peaked
            # at 3.46 GiB without the trim, 3.08 GiB with it)
            return_large_frees_to_os()
            release_kept_memory()
            sm = StreamedModel(folder, device=device, trust_remote_code=trust_remote_code)
            loaded = LoadedModel(sm, tokenizer, spec, source.model_id, content_hash, folder,
                                 source)
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        shell = ModelRunner(LoadedModel(None, tokenizer, spec, source.model_id, content_hash,
                                        folder, source), execution, device, why, w)
        raise shell.out_of_memory("loading the model", w.calib_tokens) from None
    return ModelRunner(loaded, execution, device, why, w, settings.offload_dir)


def workload_of(seq_len: int, calib_blocks: int, eval_blocks: int, calib_batch: int = 2,
                eval_batch: int = 4, full_hessians: bool = True) -> estimate.Workload:
    """The estimate's workload of a run (`full_hessians`: its compression needs each layer's
    full input Hessian, GPTQ or SparseGPT; a profile's dry run assumes it may)."""
    return estimate.Workload(calib_tokens=seq_len * calib_blocks,
                             calib_batch_tokens=seq_len * min(calib_batch, max(calib_blocks, 1)),
                             eval_tokens=seq_len * eval_blocks,
                             eval_batch_tokens=seq_len * min(eval_batch, max(eval_blocks, 1)),
                             seq_len=seq_len, full_hessians=full_hessians)


__all__ = ["Execution", "ExecutionSettings", "ModelRunner", "open_model", "pick_execution",
           "workload_of"]

