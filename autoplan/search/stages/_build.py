"""Stage 5: the Plan -- decisions, predicted metrics beside the baseline and the best uniform
recipe, the measured quality, the search record with its certificate, and the audit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from autoplan import __version__
from autoplan.compress import CompressionSettings
from autoplan.cost.report import Objective
from autoplan.numerics import signature
from autoplan.plan import schema as ps
from autoplan.cost.kv import bytes_per_token, cache_bytes
from autoplan.deploy import deploy_for
from autoplan.export.kv import scale_digest
from autoplan.formats.kv import kv_spec
from autoplan.runtimes import get_runtime, kv_supports, version_on
from autoplan.search.recovery import keep_weights, plan_quality
from autoplan.search.stages._choose import Chosen
from autoplan.search.request import kernel_timer
from autoplan.search.preparation import CALIB_BATCH, Prepared
from autoplan.search.stages._rounds import Rounds


@dataclass(frozen=True)
class SpeedSource:
    """Where the plan's speed figures come from (quality is always measured)."""

    cost_table: str | None = None  # measured GEMM times read from this file
    kernels: str | None = None  # this machine's kernels, timed (e.g. "ONNX Runtime")
    non_gemm_decode: bool = False  # the timed table includes the non-GEMM decode step

    @classmethod
    def of(cls, prep: Prepared) -> SpeedSource:
        if prep.platform.measure_kernels:
            timer = kernel_timer(prep.platform.target.name, prep.platform.runtime)
            return cls(kernels=timer.label if timer else None,
                       non_gemm_decode=bool((prep.kernel_times or {}).get("non_gemm_decode_s")))
        return cls(cost_table=prep.req.cost_table.source if prep.req.cost_table else None)

    def note(self) -> str:
        """The plan's `search.note`."""
        parts = ["speed figures are cost-model predictions"]
        if self.cost_table:
            parts.append(f" using measured GEMM times from {self.cost_table}")
        if self.kernels:
            parts.append(f" using this machine's measured {self.kernels} kernel times"
                         + (" and non-GEMM decode step" if self.non_gemm_decode else ""))
        return "".join(parts) + "; quality is measured"


def _predicted(prep: Prepared, label: str, picks) -> ps.Predicted:  # noqa: ANN001
    est = prep.cost.evaluate(prep.verifier.decisions(picks))
    m = est.metrics
    return ps.Predicted(label=label, tokens_per_s=m.throughput, ttft_s=m.ttft_s,
                        tpot_s=m.tpot_s, request_latency_s=m.request_latency_s,
                        memory_gb=est.memory.total_bytes / 1e9, fits=est.memory.fits,
                        energy_j_per_token=m.energy, usd_per_1m_tokens=m.cost,
                        weight_gb=est.memory.weights_bytes / 1e9,
                        active_weight_gb=est.active_weight_bytes / 1e9)


def _predictions(prep: Prepared, chosen: Chosen) -> tuple[dict[str, ps.Predicted], float | None]:
    """Predicted metrics of the plan, the baseline and the best uniform recipe, and the
    plan's gain over that recipe (decode speed for TPOT, end-to-end tokens/s otherwise)."""
    preds = {"plan": _predicted(prep, "plan", chosen.measurement.picks),
             "baseline": _predicted(prep, "baseline", prep.baseline_picks)}
    uniform = chosen.best_uniform
    if uniform is None:
        return preds, None
    preds["best_uniform"] = best = _predicted(prep, uniform.label, uniform.picks)
    gain = (best.tpot_s / preds["plan"].tpot_s if prep.req.objective is Objective.TPOT
            else preds["plan"].tokens_per_s / best.tokens_per_s)
    return preds, gain


def _points(prep: Prepared, rounds: Rounds, chosen: Chosen) -> list[ps.Point]:
    """Objective (predicted) vs KL (surrogate; measured where measured) of the baseline, a
    quantized source as is, every uniform recipe, every measured candidate, and the study's
    Pareto front when there is one."""
    measured = prep.verifier.measured
    out = []

    def point(kind: ps.PointKind, label: str, picks) -> ps.Point:  # noqa: ANN001 - any picks
        m = measured.get(tuple(picks))
        return ps.Point(kind=kind, label=label, objective=prep.value(picks),
                        surrogate_kl=prep.tables.surrogate(picks),
                        measured_kl=m.quality.kl if m else None,
                        measured_kl_lower_bound=m.quality.stopped_early if m else None,
                        passed=m.passed if m else None)

    out.append(point("baseline", "baseline", prep.baseline_picks))
    if prep.as_is.quantized_source:
        out.append(point("as-is", prep.as_is.label, prep.as_is.picks))
    for name, picks in prep.uniform.items():
        out.append(point("uniform", f"uniform {name}", picks))
    uniform = {tuple(p) for p in prep.uniform.values()} | {prep.baseline_picks,
                                                           prep.as_is.picks}
    for key, m in measured.items():
        if key not in uniform:
            out.append(point("candidate", m.label, key))
    for f in rounds.front:
        out.append(ps.Point(kind="front", label="front", objective=f["value"],
                            surrogate_kl=f["surrogate_kl"]))
    out.append(point("plan", "plan", chosen.measurement.picks))
    return out


def _reference(prep: Prepared) -> str:
    """What every measured figure of the plan is relative to, with the model as is."""
    keep = prep.as_is
    text = keep.reference
    m = prep.verifier.measured.get(keep.picks)
    if keep.quantized_source and m is not None:
        text += (f" ({m.label} measures {prep.req.budget.metric} {m.badness:.4g} against it, "
                 "and is always acceptable)")
    return text + (f"; {keep.note}" if keep.note else "")


def solver_audit(settings: CompressionSettings) -> dict:
    """The audit's solver fields: the thread count and numerics the SparseGPT/GPTQ weights
    were solved with, when the settings run a solver (their bits depend on it)."""
    if not settings.needs_hessian:
        return {}
    return {"solver_threads": settings.solver_threads, "solver_numerics": signature()}


def _search_meta(prep: Prepared, rounds: Rounds, chosen: Chosen, certificate: ps.Certificate | None,
                 gain: float | None, wall_time_s: float) -> ps.SearchMeta:
    req, uniform = prep.req, chosen.best_uniform
    if req.sampler is not None:
        sampler = f"{type(req.sampler).__name__} (passed in)"
    else:
        sampler = "NSGAIISampler" if req.multi_objective else "ExchangeSampler (optuna)"
    return ps.SearchMeta(
        sampler=sampler, seed=req.seed, trials=rounds.trials, wall_time_s=wall_time_s,
        study=prep.study_name, storage=prep.platform.storage_label,
        real_evaluations=prep.verifier.count, rounds=rounds.log, certificate=certificate,
        gain_over_best_uniform=gain, best_uniform=uniform.label if uniform else None,
        best_uniform_kl=uniform.quality.kl if uniform else None,
        outcome=chosen.outcome.value, note=SpeedSource.of(prep).note(),
        points=_points(prep, rounds, chosen), stopped=rounds.stopped, why=chosen.why,
        calibration=rounds.calibration.to_json() if rounds.calibration else {},
        speed_uncertainty=prep.uncertainty.to_json(), quality_reference=_reference(prep))


def _kv_section(prep: Prepared) -> ps.KvCache | None:
    """The plan's KV cache: its format and rule, what it stores, its scales' digests."""
    platform = prep.platform
    if platform.kv is None:
        return None
    answer = kv_supports(platform.target, platform.runtime, platform.kv)
    rule = answer.rule
    spec = kv_spec(platform.kv)
    kv = prep.verifier.kv
    digests = {}
    if kv is not None and spec.static:
        for i, q in sorted(kv.quants.items()):
            digests[str(i)] = scale_digest(q.k_scale, q.v_scale)
    w = prep.req.workload
    layout = prep.cost.kv
    long_eval = kv.long_evaluator if kv is not None else None
    long_tokens = int(long_eval.reference.tokens.shape[1]) if long_eval is not None else None
    return ps.KvCache(
        format=platform.kv.value, default=(platform.kv_default or platform.kv).value,
        flag=(rule.flag or str(spec.gguf)) if rule else platform.kv.value,
        scales=rule.scales if rule else "none",
        query=(rule.query or None) if rule else None, per_layer=False,
        bytes_per_token=bytes_per_token(prep.loaded.spec, layout),
        bytes_per_sequence=cache_bytes(prep.loaded.spec, layout, 1, w.input_len + w.output_len),
        scale_digests=digests, long_split_tokens=long_tokens)


def _deploy(prep: Prepared) -> ps.Deploy | None:
    """The engine's launch line for the plan's artifact at the planned batch."""
    platform, w = prep.platform, prep.req.workload
    if platform.kv is None:
        return None
    seq = cache_bytes(prep.loaded.spec, prep.cost.kv, 1, w.input_len + w.output_len)
    try:
        d = deploy_for(platform.runtime, platform.target, kv=platform.kv, batch=w.batch,
                       input_len=w.input_len, output_len=w.output_len,
                       kv_bytes_per_sequence=seq)
    except ValueError:  # a cache the engine does not serve: never planned (preflight)
        return None
    return ps.Deploy(**d.to_json())


def _machine(prep: Prepared) -> str | None:
    """The machine a `local` plan's times are of: its kernels timed on --threads threads are
    not the whole machine's, which fleet sizes."""
    machine, threads = prep.platform.target.machine, prep.req.threads
    if machine and threads is not None:
        return f"{machine}; timed on {threads} thread{'s' if threads > 1 else ''}"
    return machine


def build_plan(prep: Prepared, rounds: Rounds, chosen: Chosen, certificate: ps.Certificate | None,
               wall_time_s: float) -> ps.Plan:
    """The plan file's content (not written here)."""
    req, loaded, cost, budget = prep.req, prep.loaded, prep.cost, prep.req.budget
    target, rt = prep.platform.target, get_runtime(prep.platform.runtime)
    m = chosen.measurement
    q = m.quality
    preds, gain = _predictions(prep, chosen)
    return ps.Plan(
        autoplan_version=__version__, created=datetime.now(timezone.utc).isoformat(),
        model=ps.ModelRef(id=loaded.model_id, content_hash=loaded.content_hash,
                          model_type=loaded.spec.model_type, n_layers=loaded.spec.n_layers,
                          params=loaded.spec.total_params),
        target=ps.TargetRef(name=target.name, price_per_hour=cost.price_per_hour,
                            price_source="user" if req.price_per_hour is not None
                            else target.price_per_hour.source, machine=_machine(prep)),
        runtime=ps.RuntimeRef(name=rt.name, version=version_on(target, rt.name)),  # installed, here
        workload=req.workload, objective=req.objective.value,
        budget=ps.Budget(text=budget.text, metric=budget.metric, limit=budget.limit,
                         suite_file=str(budget.suite_file) if budget.suite_file else None,
                         name=budget.name, also=[b.text for b in req.also]),
        compression=ps.Compression(prune_score=req.settings.prune_score,
                                   quant_method=req.settings.quant_method),
        decisions={n: str(c) for n, c in sorted(prep.verifier.decisions(m.picks).items())},
        predicted=preds,
        quality=plan_quality(q, m.surrogate, m.passed),
        search=_search_meta(prep, rounds, chosen, certificate, gain, wall_time_s),
        audit=ps.Audit(calibration_source=prep.data.source,
                       calibration_hash=prep.data.content_hash,
                       calibration=ps.CalibrationSettings(
                           seq_len=req.seq_len, n_calib=req.calib_blocks,
                           n_eval=req.eval_blocks, seed=req.seed, batch_size=CALIB_BATCH),
                       tensors=m.audit, **solver_audit(req.settings)),
        operating_point=ps.OperatingPoint(**prep.platform.point.to_json())
        if prep.platform.point else None,
        recovery=keep_weights(m, req.out),
        routing=cost.routing.to_json() if loaded.spec.moe is not None else None,
        kv_cache=_kv_section(prep),
        deploy=_deploy(prep),
    )


__all__ = ["SpeedSource", "build_plan"]
