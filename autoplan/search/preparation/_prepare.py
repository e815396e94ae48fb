"""Stage 1 of a search: everything the study needs, built once from a checked request.

model -> decision space -> calibration/evaluation tokens -> sensitivity profile (cached)
-> this machine's kernel times (when measured) -> cost model -> per-unit tables ->
the verifier that measures candidates on the real model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from autoplan.cost.model import CostModel
from autoplan.cost.moe import Routing
from autoplan.cost.report import DIRECTION, Objective
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models import LoadedModel
from autoplan.cache_dir import cache_root
from autoplan.quality.slices import build_slices
from autoplan.quality.suite import load_suite
from autoplan.quality.text import TextDataset, load_text_dataset
from autoplan.search.optimize import SearchSpace, Tables, build_space, build_tables, load_space_file
from autoplan.search.recovery import RecoveryStage, RecoveryText, recovery_text, work_dir_for
from autoplan.search.reporter import Reporter
from autoplan.search.preparation._as_is import AsIs, as_is
from autoplan.search.preparation._engine_frame import rebase_on_as_is
from autoplan.search.request import (
    ONNX_RUNTIME,
    Platform,
    SearchRequest,
    fits_reference,
    in_memory_only,
    kernel_timer,
)
from autoplan.search.preparation._uncertainty import SpeedUncertainty, speed_uncertainty
from autoplan.search.verify import (KvSimulation, QualityBudget, SharedMeasurements, Verifier,
                                    build_gates, measurement_store)
from autoplan.quant.kv_cache import kv_quants
from autoplan.runtimes import kv_supports
from autoplan.sensitivity import SensitivityProfile, calibration_key
from autoplan.sensitivity.kv import kv_key, kv_unit
from autoplan.streaming import open_model
from autoplan.streaming.candidates import Evaluator
from autoplan.streaming.runner import ModelRunner, workload_of

CALIB_BATCH = 2  # calibration blocks per forward pass (part of the audit: it changes rounding)


@dataclass(frozen=True)
class Prepared:
    """The inputs of every later stage."""

    req: SearchRequest
    platform: Platform
    loaded: LoadedModel
    runner: ModelRunner  # where and how the model runs (device; in memory or streamed)
    space: SearchSpace
    data: TextDataset
    profile: SensitivityProfile
    kernel_times: dict[str, Any] | None  # measured rows the cost model uses, if any
    cost: CostModel
    tables: Tables
    verifier: Verifier
    study_name: str
    as_is: AsIs  # the model as the user has it, always a candidate (_as_is.py)

    @property
    def sign(self) -> float:
        """-1 when the objective is maximized, so `sign * value` is always minimized."""
        return -1.0 if DIRECTION[self.req.objective] == "maximize" else 1.0

    @cached_property
    def uniform(self) -> dict[str, list[int]]:
        """Each choice applied wherever it is allowed (its uniform recipe), by name."""
        return {str(c): p for c in self.space.all_choices if (p := self.tables.uniform_picks(c))}

    @cached_property
    def baseline_picks(self) -> tuple[int, ...]:
        """Every unit left at the baseline choice (the uncompressed model)."""
        return tuple(self.tables.picks_of({}))

    @cached_property
    def uncertainty(self) -> SpeedUncertainty:
        """How far a predicted speed ratio may be off on this platform (_uncertainty.py),
        or the request's `min_gain`."""
        if self.req.min_gain is not None:
            return SpeedUncertainty(self.req.min_gain, "--min-gain")
        timer = kernel_timer(self.platform.target.name, self.platform.runtime) \
            if self.platform.measure_kernels else None
        label = timer.label if timer is not None else None
        return speed_uncertainty(self.platform.target, self.kernel_times, label,
                                 moe=self.loaded.spec.moe is not None)

    def value(self, picks) -> float:  # noqa: ANN001 - any sequence of choice indices
        """The objective metric of a pick, from the cost model."""
        return self.cost.metric_from_times(*self.tables.times(picks), self.req.objective)


def study_name(req: SearchRequest, platform: Platform, model_hash: str, calib_hash: str) -> str:
    """A name derived from every setting that changes the study, so a re-run resumes it."""
    choices = None if req.choices is None else tuple(str(c) for c in req.choices)
    key = "|".join(map(str, (
        model_hash, req.target, platform.runtime, req.workload.model_dump_json(),
        req.objective.value, req.budget.text, req.settings.prune_score.value,
        req.settings.quant_method.value, req.seed, calib_hash, req.multi_objective,
        req.protect_first_block, req.protect_last_block, choices, platform.measure_kernels,
        req.cost_table.source if req.cost_table else None)
        + ((req.threads,) if req.threads is not None else ())
        + _measurement_key(req)))
    return f"autoplan-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _measurement_key(req: SearchRequest) -> tuple:
    """What else changes a measurement or the rounds (further budgets, slices, lm-eval task
    folder and limit, recovery, the SparseGPT/GPTQ solvers' thread count, which changes
    their bits): empty by default, so a plain search keeps its study name."""
    lmeval = any((b.name or "").startswith("lm-eval:") for b in req.budgets)
    return ((tuple(b.text for b in req.also),) if req.also else ()) \
        + (("no-slices",) if not req.slices else ()) \
        + ((req.lmeval_tasks, req.lmeval_limit) if lmeval else ()) \
        + ((req.recovery.key(),) if req.recovery is not None else ()) \
        + ((f"solver-threads={req.settings.solver_threads}",)
           if req.settings.needs_hessian else ()) \
        + ((f"kv={getattr(req.kv_cache[0], 'value', req.kv_cache[0])}", req.long_len, req.long_blocks, req.kv_gate)
           if req.kv_cache and len(req.kv_cache) == 1 and req.kv_cache != ("auto",) else ())


def _kernel_times(req: SearchRequest, platform: Platform, loaded: LoadedModel,
                  space: SearchSpace, rep: Reporter) -> dict[str, Any] | None:
    if not platform.measure_kernels:
        return req.cost_table.document if req.cost_table else None
    timer = kernel_timer(platform.target.name, platform.runtime)
    assert timer is not None  # preflight refused --measure-kernels without one
    rep.stage(f"timing {timer.label} kernels")
    return timer.time(loaded, space, req.workload, threads=req.threads, progress=rep.note)


def _gates(req: SearchRequest, loaded: LoadedModel) -> list:
    return build_gates(req.budgets, loaded, seed=req.seed, lmeval_tasks=req.lmeval_tasks,
                       lmeval_limit=req.lmeval_limit)


@dataclass(frozen=True)
class ModelWork:
    """What every platform's search of one model shares: the model, its tokens, the
    evaluator of the original (its reference log-probs) and the verifications made so far."""

    runner: ModelRunner
    data: TextDataset
    calib: list[torch.Tensor]
    evaluator: Evaluator
    shared: SharedMeasurements

    @property
    def loaded(self) -> LoadedModel:
        return self.runner.loaded


def open_model_work(req: SearchRequest, rep: Reporter, measure_kernels: bool = False,
                    kv: bool = False) -> tuple[ModelRunner, TextDataset]:
    """Load the model and draw its calibration/evaluation tokens (`kv`: some platform
    compresses the KV cache, whose long-context check needs the model in memory)."""
    torch.manual_seed(req.seed)
    rep.stage("loading model")
    what = in_memory_only(req, measure_kernels)  # None: the request can stream
    if what is None and kv:
        what = f"--kv-cache (its long-context check, {req.kv_gate})"
    runner = open_model(req.model, req.execution, trust_remote_code=req.trust_remote_code,
                        workload=workload_of(req.seq_len, req.calib_blocks, req.eval_blocks,
                                             CALIB_BATCH,
                                             full_hessians=req.settings.needs_hessian),
                        needs_memory=what)
    rep.note(f"{runner.execution} execution on {runner.device} ({runner.why})")
    if runner.execution == "stream" and what:  # refused before profiling (a worker's own
        # --execution stream is not preflighted)
        fix = ("pass --execution memory" if req.execution.execution == "stream" else
               f"it does not fit ({runner.why}): free memory, or use a machine with more")
        raise UserInputError(f"{what} needs the model in memory: {fix}")
    data = load_text_dataset(req.text, tokenizer=runner.loaded.tokenizer, seq_len=req.seq_len,
                             n_calib=req.calib_blocks, n_eval=req.eval_blocks, seed=req.seed)
    return runner, data


def platform_space(req: SearchRequest, platform: Platform, loaded: LoadedModel) -> SearchSpace:
    """The decision space of one platform (what its runtime accelerates on its target)."""
    if platform.runtime == ONNX_RUNTIME:  # what the config alone could not show (window, act)
        from autoplan.backends.cpu.onnx_graph import check_supported

        check_supported(loaded.model.config)
    candidates = list(req.choices) if req.choices else None
    if platform.unfit is not None:  # only formats no larger than the one whose recipe fits
        pool = candidates or [Choice.parse(c) for c in
                              load_space_file(platform.target.platform).candidates]
        candidates = [c for c in pool if fits_reference(c, platform.unfit.reference)]
    return build_space(loaded.spec, platform.target, platform.runtime,
                       protect_first_block=req.protect_first_block,
                       protect_last_block=req.protect_last_block, candidates=candidates)


def profile_spaces(req: SearchRequest, runner: ModelRunner, calib: list[torch.Tensor],
                   spaces: list[SearchSpace], rep: Reporter) -> SensitivityProfile:
    """One sensitivity profile over the union of the spaces' layers, each layer scored for
    the choices some space offers it (one calibration pass; the cache is per layer x
    choice, so only missing entries are scored). Per layer, not the union of all choices:
    a compare's GPU spaces keep lm_head at the baseline, so it is not scored for their
    formats (a quarter of the scoring for SmolLM2 over six targets)."""
    rep.stage("profiling sensitivity")
    choices: dict[str, list[Choice]] = {}
    for sp in spaces:
        for u in sp.units:
            for la in u.layers:
                known = choices.setdefault(la.name, [])
                known += [c for c in u.choices if c != sp.baseline and c not in known]
    layers = list(choices)
    loaded = runner.loaded
    return runner.build_profile(
        layers, choices, calib, model_hash=loaded.content_hash,
        calib_hash=calibration_key(calib), settings=req.settings,
        cache_dir=cache_root() / "profiles", seed=req.seed,
        on_progress=lambda d, t: rep.progress("profile", d, t), executor=req.executor)


def model_work(req: SearchRequest, runner: ModelRunner, data: TextDataset,
               rep: Reporter, gates: list | None = None) -> ModelWork:
    """The evaluator of the original model (measured once, with the KL slices and the
    budgets' gates unless given) with its verification cache: empty in memory,
    backed by the measurements of earlier runs on disk (`measurement_cache`)."""
    calib = list(data.calib.split(CALIB_BATCH))
    budget = req.budget
    loaded = runner.loaded
    suite = load_suite(budget.suite_file, loaded.tokenizer) if budget.suite_file else None
    rep.stage("measuring the original model")
    wants_slices = req.slices or any(b.metric == "slice" for b in req.budgets)
    extra = {} if runner.execution == "stream" else {  # refused with gates in open_model_work
        "gates": _gates(req, loaded) if gates is None else gates,
        "slices": build_slices(loaded.tokenizer) if wants_slices else None}
    evaluator = runner.evaluator(data.eval, calib_batches=calib, suite=suite,
                                 cache_dir=cache_root() / "references", **extra)
    store = measurement_store(cache_root() / "measurements",
                              reference_key=runner.reference_key(data.eval),
                              calib_hash=calibration_key(calib), settings=req.settings,
                              evaluator=evaluator)
    return ModelWork(runner, data, calib, evaluator, SharedMeasurements(store=store))


@dataclass(frozen=True)
class KvWork:
    """What the platforms with a compressed KV cache share: the calibrated |K|, |V| per
    block (their static scales), and the evaluator of the long-prompt split, with the
    long-context check in memory."""

    amax: dict
    long_evaluator: Evaluator
    long_len: int
    gate: QualityBudget | None  # the check every such plan meets (None: a --budget has it)


@dataclass(frozen=True)
class SharedWork:
    """What the platforms searched for one model share (stage 1a): the model work, one
    decision space per platform, ONE profile over their union, the recovery text."""

    work: ModelWork
    spaces: tuple[SearchSpace, ...]
    profile: SensitivityProfile
    recovery: RecoveryText | None  # tokenized once, with --recover
    profile_s: float  # the profile's wall time (0 when it was given)
    kv: KvWork | None = None  # when some platform compresses the KV cache


def kv_request(platforms: list[Platform]) -> dict:
    """The compressed KV caches to profile, each with its engine's query rounding."""
    out = {}
    for p in platforms:
        if p.kv_compressed:
            out[p.kv] = kv_supports(p.target, p.runtime, p.kv).query
    return out


def long_len_of(req: SearchRequest, context: int) -> int:
    """The long-prompt split's block length: as asked, else max(2048, input + output)
    within the model's context."""
    want = req.long_len or max(2048, req.workload.input_len + req.workload.output_len)
    return min(want, context)


def kv_work(req: SearchRequest, platforms: list[Platform], work: ModelWork,
            rep: Reporter) -> KvWork:
    """The KV calibration and the long-prompt evaluator (with the long-context check, in
    memory) the compressed-cache platforms measure with."""
    runner, loaded = work.runner, work.loaded
    rep.stage("calibrating the KV cache")
    amax = runner.kv_amax(work.calib, work.evaluator)
    config = getattr(loaded.model, "config", None)
    context = int(getattr(config, "max_position_embeddings", 0) or 2048)
    long_len = long_len_of(req, context)
    text = load_text_dataset(req.text, tokenizer=loaded.tokenizer, seq_len=long_len,
                             n_calib=0, n_eval=req.long_blocks, seed=req.seed)
    own = next((b for b in req.budgets if b.name == "longctx"), None)
    gate = None if own is not None else QualityBudget.parse(req.kv_gate)
    gates = []
    if runner.execution != "stream":
        from autoplan.quality.longctx import LongContextGate

        check = own or gate
        gates = [LongContextGate(loaded.tokenizer, loaded.model, max_len=check.max_len or long_len,
                                 seed=req.seed)]
    rep.stage(f"measuring the original model on {req.long_blocks} x {long_len} tokens")
    # one long block per pass: its logits are batch x length x vocab floats
    extra = {} if runner.execution == "stream" else {"gates": gates, "batch_size": 1}
    evaluator = runner.evaluator(text.eval, calib_batches=(), **extra)
    return KvWork(amax, evaluator, long_len, gate if runner.execution != "stream" else None)


def prepare_shared(reqs: list[SearchRequest], platforms: list[Platform], rep: Reporter,
                   profile: SensitivityProfile | None = None) -> SharedWork:
    """Load the model and its tokens once, build each platform's space, profile their union
    (unless `profile` is given: a worker passes its driver's, so its tables are the driver's
    to the last bit) and measure the original. `reqs[0]` holds what they share (model,
    text, seed, budget, settings)."""
    req = reqs[0]
    runner, data = open_model_work(req, rep, any(p.measure_kernels for p in platforms),
                                   kv=any(p.kv_compressed for p in platforms))
    spaces = tuple(platform_space(r, p, runner.loaded)
                   for r, p in zip(reqs, platforms, strict=True))
    calib = list(data.calib.split(CALIB_BATCH))
    # a task whose data is not here, or too little recovery text, fails now, in seconds
    gates = _gates(req, runner.loaded)
    text = recovery_text(req.recovery, runner.loaded.tokenizer) if req.recovery else None
    t_profile = time.perf_counter()
    kv_formats = kv_request(platforms)
    if profile is None:
        profile = profile_spaces(req, runner, calib, list(spaces), rep)
        if kv_formats:
            rep.stage("profiling KV-cache formats")
            profile = runner.build_kv_profile(
                kv_formats, calib, model_hash=runner.loaded.content_hash,
                calib_hash=calibration_key(calib), settings=req.settings,
                cache_dir=cache_root() / "profiles", seed=req.seed)
        profile_s = time.perf_counter() - t_profile
    else:
        profile_s = 0.0
    work = model_work(req, runner, data, rep, gates=gates)
    kv = kv_work(req, platforms, work, rep) if kv_formats else None
    return SharedWork(work, spaces, profile, text, profile_s, kv)


def prepare_platform(req: SearchRequest, platform: Platform, shared: SharedWork,
                     space: SearchSpace, rep: Reporter) -> Prepared:
    """Stage 1b: the cost model, tables and verifier of one platform, on the shared work
    (with `--recover`, its recovery stage)."""
    if platform.point is not None:  # `--batch max` / SLO: plan for the resolved batch
        req = dataclasses.replace(req, workload=platform.point.workload)
    work, profile = shared.work, shared.profile
    loaded = work.loaded
    kernel_times = _kernel_times(req, platform, loaded, space, rep)
    cost = CostModel(loaded.spec, platform.target, req.workload,
                     price_per_hour=req.price_per_hour, measured=kernel_times,
                     baseline=space.baseline, kv=platform.kv,
                     # MoE: the experts the calibration picked
                     routing=Routing.of_profile(loaded.spec, profile.routing, profile.tokens))
    tables = build_tables(space, cost, profile,
                          prefill_weight=0.0 if req.objective is Objective.TPOT else 1.0)
    kv, also = None, req.also
    if platform.kv_compressed and shared.kv is not None:
        kv = _kv_simulation(platform, shared.kv, loaded.spec.n_layers)
        tables = with_kv_surrogate(tables, kv_surrogate(profile, platform, loaded.spec.n_layers))
        also = (*also, shared.kv.gate) if shared.kv.gate is not None else also
    calib_tokens = sum(b.numel() for b in work.calib)
    stage = None
    if req.recovery is not None:
        text = shared.recovery or recovery_text(req.recovery, loaded.tokenizer)
        stage = RecoveryStage(req.recovery, text, loaded.content_hash, work_dir_for(req.out), rep)
    keep = as_is(loaded, space, tuple(tables.picks_of({})))
    evaluator = work.evaluator
    if keep.quantized_source:  # measure against the file as its engine runs it
        rep.stage("measuring the source as its engine runs it")
        evaluator, keep = rebase_on_as_is(keep, evaluator,
                                          space.decisions(tables.choices_of(keep.picks)),
                                          req.settings, space.baseline)
    verifier = Verifier(loaded.model, space, tables, evaluator, req.budget, req.settings,
                        work.calib, shared=work.shared,
                        out_of_memory=lambda what: work.runner.out_of_memory(what, calib_tokens),
                        recovery=stage, also=also, kv=kv, frame=keep.frame)
    name = req.study or study_name(req, platform, loaded.content_hash, work.data.content_hash)
    return Prepared(req, platform, loaded, work.runner, space, work.data, profile, kernel_times,
                    cost, tables, verifier, name, keep)


def kv_surrogate(profile: SensitivityProfile, platform: Platform, n_blocks: int) -> float:
    """The profile's KL estimate of the platform's KV cache, summed over blocks."""
    query = kv_supports(platform.target, platform.runtime, platform.kv).query
    key = kv_key(platform.kv, query)
    return sum(profile.kv[kv_unit(i)][key] for i in range(n_blocks))


def with_kv_surrogate(tables: Tables, cost: float) -> Tables:
    """``tables`` with the KV cache's surrogate KL on every choice of the first unit: every
    candidate, the all-baseline one included, then carries it exactly once, so the study,
    the exact solver and the rounds' limit all see it without knowing it is there."""
    if not tables.quality:
        return tables
    return dataclasses.replace(tables, quality=(tables.quality[0] + cost, *tables.quality[1:]))


def _kv_simulation(platform: Platform, kv: KvWork, n_blocks: int) -> KvSimulation:
    query = kv_supports(platform.target, platform.runtime, platform.kv).query
    quants = kv_quants({i: platform.kv for i in range(n_blocks)}, kv.amax, query)
    return KvSimulation(kv_key(platform.kv, query), quants, kv.long_evaluator)


def prepare(req: SearchRequest, platform: Platform, rep: Reporter,
            profile: SensitivityProfile | None = None) -> Prepared:
    """Stage 1 for one platform: `prepare_shared`, then `prepare_platform`."""
    shared = prepare_shared([req], [platform], rep, profile)
    return prepare_platform(req, platform, shared, shared.spaces[0], rep)


__all__ = ["CALIB_BATCH", "KvWork", "ModelWork", "Prepared", "SharedWork", "kv_request",
           "kv_surrogate", "kv_work", "long_len_of", "model_work", "with_kv_surrogate",
           "open_model_work", "platform_space", "prepare", "prepare_platform", "prepare_shared",
           "profile_spaces", "study_name"]
