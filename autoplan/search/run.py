"""`autoplan search` as a library call: profile -> study on the surrogate -> verify the best
candidates on the real model -> correct the surrogate and continue -> certify -> Plan.

The measured budget metric is the only thing that decides whether a plan passes. If no
searched candidate passes, the best uniform recipe that passes is returned, and the
uncompressed baseline (which always passes) if none does: the search never ends with
nothing and never silently exceeds the budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from autoplan import __version__
from autoplan.compress import CompressionSettings
from autoplan.cost.measured import load_cost_table
from autoplan.cost.model import CostModel
from autoplan.cost.report import DIRECTION, Objective
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models import load_model
from autoplan.models._cache import cache_root
from autoplan.plan import schema as ps
from autoplan.plan.io import save_plan
from autoplan.quality.evaluator import QualityEvaluator
from autoplan.quality.suite import load_suite
from autoplan.quality.text import load_text_dataset
from autoplan.runtimes import default_runtime, get_runtime
from autoplan.search.budget import QualityBudget
from autoplan.search.knapsack import solve_exact
from autoplan.search.owl import lagrangian_allocations, owl_allocations
from autoplan.search.space import build_space
from autoplan.search.storage import default_storage_url, redact
from autoplan.search.study import StudyConfig, run_study
from autoplan.search.tables import build_tables
from autoplan.search.verify import Measurement, Verifier
from autoplan.sensitivity import build_profile, calibration_key
from autoplan.sensitivity.executor import Executor
from autoplan.targets import get_target
from autoplan.workload import Workload

SAFETY = 0.9  # aim the surrogate limit 10% inside the calibrated budget
CALIB_BATCH = 2  # calibration blocks per forward pass (part of the audit: it changes rounding)


@dataclass(frozen=True)
class SearchRequest:
    """Everything `autoplan search` takes; defaults suit the embedded model on a laptop CPU."""

    model: str = "smollm2-135m"
    target: str = "h100-sxm"
    runtime: str | None = None
    budget: str = "kl<=0.05"
    objective: str = "throughput"
    workload: Workload = field(default_factory=lambda: Workload(batch=32, input_len=512,
                                                                output_len=128))
    trials: int = 2000
    seed: int = 0
    storage: str | None = None
    study: str | None = None
    out: Path = Path("plan.json")
    multi_objective: bool = False
    prune_score: str = "wanda"
    quant_method: str = "rtn"
    text: str | None = None
    seq_len: int = 256
    calib_blocks: int = 4
    eval_blocks: int = 6
    protect_first_block: bool | None = None
    protect_last_block: bool | None = None
    verify_top: int = 2
    max_rounds: int = 3
    price_per_hour: float | None = None
    trust_remote_code: bool = False
    cost_table: str | None = None  # measured GEMM times replacing the analytic ones
    # Time this machine's kernels (ONNX Runtime's, or ggml's for llama.cpp) for every
    # candidate and plan with them. None: yes exactly when planning for this machine
    # (--target local with --runtime onnxruntime or llama.cpp), where the analytic model is
    # 1.1-1.9x pessimistic (docs/benchmarks.md, CPU section).
    measure_kernels: bool | None = None
    choices: tuple[str, ...] | None = None  # candidate formats (default: the space file's)
    # Engine threads the measured kernels are timed with (None: physical cores).
    threads: int | None = None


class Reporter:
    """Progress sink; the CLI subclasses it with rich bars. All methods are no-ops here."""

    def stage(self, name: str) -> None: ...

    def progress(self, task: str, done: int, total: int) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass
class SearchOutcome:
    plan: ps.Plan
    front: list[dict] = field(default_factory=list)


def _study_name(req: SearchRequest, model_hash: str, runtime: str, calib_hash: str) -> str:
    key = "|".join(map(str, (model_hash, req.target, runtime, req.workload.model_dump_json(),
                             req.objective, req.budget, req.prune_score, req.quant_method,
                             req.seed, calib_hash, req.multi_objective,
                             req.protect_first_block, req.protect_last_block,
                             req.choices, req.measure_kernels, req.cost_table)
                             + ((req.threads,) if req.threads is not None else ())))
    return f"autoplan-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def parse_choices(texts: tuple[str, ...] | None) -> list[Choice] | None:
    """`--choices` as distinct Choices in the given order (None: the platform's space)."""
    if texts is None:
        return None
    choices = list(dict.fromkeys(Choice.parse(t) for t in texts))
    if not choices:
        raise UserInputError("--choices is empty: list formats, e.g. int4a8_g32,int8a8_g128")
    return choices


# Runtimes whose kernels --measure-kernels times on this machine, and what times them.
KERNEL_TABLES = {"onnxruntime": ("ONNX Runtime", "autoplan.bench.predict"),
                 "llama.cpp": ("llama.cpp (ggml)", "autoplan.backends.cpu.ggml_microbench")}


def _measures_kernels(req: SearchRequest, target: str, runtime: str) -> bool:
    if req.measure_kernels is not None:
        return req.measure_kernels
    return target == "local" and runtime in KERNEL_TABLES and not req.cost_table


def run_search(req: SearchRequest, reporter: Reporter | None = None,
               executor: Executor | None = None) -> SearchOutcome:
    """`executor` runs the profile's scoring tasks and each round's candidate verifications
    (in this process by default; a RayExecutor shards them)."""
    rep = reporter or Reporter()
    t_start = time.perf_counter()
    if req.trials < 1:
        raise UserInputError("--trials must be at least 1")
    if req.threads is not None and req.threads < 1:
        raise UserInputError(f"--threads must be a positive integer, got {req.threads}")
    target = get_target(req.target)
    runtime = get_runtime(req.runtime).name if req.runtime else default_runtime(target)
    budget = QualityBudget.parse(req.budget)
    objective = Objective(req.objective)
    settings = CompressionSettings(req.prune_score, req.quant_method)
    torch.manual_seed(req.seed)

    measure_kernels = _measures_kernels(req, target.name, runtime)
    req = dataclasses.replace(req, measure_kernels=measure_kernels)
    if measure_kernels and (target.name != "local" or runtime not in KERNEL_TABLES):
        raise UserInputError("--measure-kernels times this machine's kernels: use it with "
                             "--target local and --runtime onnxruntime or llama.cpp")
    if measure_kernels and runtime == "llama.cpp":
        from autoplan.engines import engine_python

        engine_python("llama.cpp")  # a missing engine is refused before any work
    if measure_kernels and req.cost_table:
        raise UserInputError("pass --measure-kernels or --cost-table, not both")
    candidates = parse_choices(req.choices)

    rep.stage("loading model")
    loaded = load_model(req.model, trust_remote_code=req.trust_remote_code)
    space = build_space(loaded.spec, target, runtime, protect_first_block=req.protect_first_block,
                        protect_last_block=req.protect_last_block, candidates=candidates)
    data = load_text_dataset(req.text, tokenizer=loaded.tokenizer, seq_len=req.seq_len,
                             n_calib=req.calib_blocks, n_eval=req.eval_blocks, seed=req.seed)
    calib = list(data.calib.split(CALIB_BATCH))

    rep.stage("profiling sensitivity")
    choices = [c for c in space.all_choices if c != space.baseline]
    layers = [la.name for u in space.units for la in u.layers]
    profile = build_profile(
        loaded.model, layers, choices, calib, model_hash=loaded.content_hash,
        calib_hash=calibration_key(calib), settings=settings, cache_dir=cache_root() / "profiles",
        seed=req.seed, on_progress=lambda d, t: rep.progress("profile", d, t), executor=executor)

    measured = load_cost_table(req.cost_table)
    if measure_kernels:
        import importlib

        label, module = KERNEL_TABLES[runtime]
        rep.stage(f"timing {label} kernels")
        measured = importlib.import_module(module).search_kernel_table(
            loaded, space, req.workload, threads=req.threads, progress=rep.note)
    cost = CostModel(loaded.spec, target, req.workload, price_per_hour=req.price_per_hour,
                     measured=measured, baseline=space.baseline)
    tables = build_tables(space, cost, profile,
                          prefill_weight=0.0 if objective is Objective.TPOT else 1.0)
    suite = load_suite(budget.suite_file, loaded.tokenizer) if budget.suite_file else None
    rep.stage("measuring the original model")
    evaluator = QualityEvaluator(loaded.model, data.eval, suite=suite)
    verifier = Verifier(loaded.model, space, tables, evaluator, budget, settings, calib)

    storage_url = req.storage or default_storage_url(req.out)
    study_name = req.study or _study_name(req, loaded.content_hash, runtime, data.content_hash)
    sign = -1.0 if DIRECTION[objective] == "maximize" else 1.0

    def value(picks) -> float:  # noqa: ANN001
        return cost.metric_from_times(*tables.times(picks), objective)

    uniform = {str(c): p for c in space.all_choices if (p := tables.uniform_picks(c))}
    limit = budget.limit / budget.prior_slope * SAFETY
    rounds: list[dict] = []
    chosen: Measurement | None = None
    front: list[dict] = []
    trials_total = 0
    best_searched = None
    for k in range(req.max_rounds):
        rep.stage(f"search round {k + 1}: surrogate KL <= {limit:.4g}")
        warm = [p for p in uniform.values() if tables.surrogate(p) <= limit]
        warm += owl_allocations(tables, profile) + lagrangian_allocations(tables, limit)
        warm += [list(m.picks) for m in verifier.measured.values() if m.surrogate <= limit]
        cfg = StudyConfig(objective, req.trials if k == 0 else max(req.trials // 4, 1),
                          req.seed + k, study_name if k == 0 else f"{study_name}-r{k}",
                          storage_url, req.multi_objective)
        result = run_study(tables, limit, cost, cfg, warm,
                           on_trial=lambda d, t: rep.progress("trials", d, t))
        trials_total += result.n_trials
        if result.front:
            front = [{"value": c.value, "surrogate_kl": c.surrogate,
                      "decisions": {u: str(ch) for u, ch in tables.choices_of(c.picks).items()}}
                     for c in result.front]
        best_searched = result.candidates[0] if result.candidates else None
        rep.stage(f"verifying round {k + 1}")
        to_check = [c for c in result.candidates if c.picks not in verifier.measured]
        n_check = min(len(to_check), req.verify_top)
        rep.progress("verify", 0, n_check)
        checked = verifier.measure_many(
            [(c.picks, f"round{k + 1}-candidate{i + 1}") for i, c in enumerate(to_check[:n_check])],
            executor, on_done=lambda d: rep.progress("verify", d, n_check))
        passing = [m for m in verifier.measured.values() if m.passed]
        rounds.append({"round": k + 1, "surrogate_limit": limit, "trials": result.n_trials,
                       "resumed_trials": result.resumed,
                       "verified": [{"label": m.label, "surrogate_kl": m.surrogate,
                                     "badness": m.badness, "passed": m.passed} for m in checked]})
        if passing:
            chosen = min(passing, key=lambda m: sign * value(m.picks))
            if best_searched is None or chosen.picks == best_searched.picks or \
                    sign * value(chosen.picks) <= sign * value(best_searched.picks):
                break
        slope = verifier.slope(budget.prior_slope)
        new_limit = budget.limit / slope * SAFETY
        limit = new_limit if new_limit < limit else limit * 0.5
        if not checked:
            break

    rep.stage("best uniform recipe")
    best_uniform: Measurement | None = None
    ordered = sorted(uniform.items(), key=lambda kv: sign * value(kv[1]))
    for name, picks in ordered[:6]:
        if picks == tables.picks_of({}):
            continue
        m = verifier.measure(picks, f"uniform {name}")
        if m.passed:
            best_uniform = dataclasses.replace(m, label=f"uniform {name}")
            break
    baseline_picks = tuple(tables.picks_of({}))  # Measurement.picks is a tuple
    outcome = "plan"
    if chosen is None or (best_uniform and sign * value(best_uniform.picks) < sign * value(chosen.picks)):
        if chosen is None:
            outcome = "uniform-fallback" if best_uniform else "baseline-fallback"
            chosen = best_uniform or verifier.measure(baseline_picks, "baseline")
            rep.note("no searched plan met the budget when measured; returning the best "
                     f"{'uniform recipe' if best_uniform else 'baseline'} that passes")
        else:
            outcome, chosen = "uniform-fallback", best_uniform
    if chosen.picks == baseline_picks:
        outcome = "baseline-fallback"
        rep.note("nothing beats the baseline within the budget")

    rep.stage("certificate")
    exact = solve_exact(tables, limit)
    searched_time = tables.request_time(best_searched.picks) if best_searched else float("nan")
    certificate = ps.Certificate(
        solver="scipy.optimize.milp (HiGHS)", optimum_objective=value(exact.picks),
        search_objective=value(best_searched.picks) if best_searched else float("nan"),
        gap=(searched_time - exact.total_time) / exact.total_time if best_searched else float("nan"),
        surrogate_limit=limit)

    def predicted(label: str, picks) -> ps.Predicted:  # noqa: ANN001
        est = cost.evaluate(verifier.decisions(picks))
        m = est.metrics
        return ps.Predicted(label=label, tokens_per_s=m.throughput, ttft_s=m.ttft_s,
                            tpot_s=m.tpot_s, request_latency_s=m.request_latency_s,
                            memory_gb=est.memory.total_bytes / 1e9, fits=est.memory.fits,
                            energy_j_per_token=m.energy, usd_per_1m_tokens=m.cost,
                            weight_gb=est.memory.weights_bytes / 1e9)

    preds = {"plan": predicted("plan", chosen.picks), "baseline": predicted("baseline", baseline_picks)}
    gain = None
    if best_uniform:
        preds["best_uniform"] = predicted(best_uniform.label, best_uniform.picks)
        # decode speed for the TPOT objective, end-to-end tokens/s otherwise
        gain = (preds["best_uniform"].tpot_s / preds["plan"].tpot_s
                if objective is Objective.TPOT
                else preds["plan"].tokens_per_s / preds["best_uniform"].tokens_per_s)
    q = chosen.quality
    rt = get_runtime(runtime)
    plan = ps.Plan(
        autoplan_version=__version__, created=datetime.now(timezone.utc).isoformat(),
        model=ps.ModelRef(id=loaded.model_id, content_hash=loaded.content_hash,
                          model_type=loaded.spec.model_type, n_layers=loaded.spec.n_layers,
                          params=loaded.spec.total_params),
        target=ps.TargetRef(name=target.name, price_per_hour=cost.price_per_hour,
                            price_source="user" if req.price_per_hour is not None
                            else target.price_per_hour.source),
        runtime=ps.RuntimeRef(name=rt.name, version=rt.version),
        workload=req.workload.model_dump(), objective=objective.value,
        budget=ps.Budget(text=budget.text, metric=budget.metric, limit=budget.limit,
                         suite_file=str(budget.suite_file) if budget.suite_file else None),
        compression=ps.Compression(prune_score=settings.prune_score,
                                   quant_method=settings.quant_method),
        decisions={n: str(c) for n, c in sorted(verifier.decisions(chosen.picks).items())},
        predicted=preds,
        quality=ps.Quality(kl=q.kl, ppl=q.ppl, ppl_ref=q.ppl_ref, suite_score=q.suite_score,
                           suite_ref=q.suite_score_ref, surrogate_kl=chosen.surrogate,
                           budget_met=chosen.passed, eval_tokens=q.n_tokens),
        search=ps.SearchMeta(
            sampler="ExchangeSampler (optuna)" if not req.multi_objective else "NSGAIISampler",
            seed=req.seed, trials=trials_total, wall_time_s=time.perf_counter() - t_start,
            study=study_name, storage=redact(storage_url), real_evaluations=verifier.count,
            rounds=rounds, certificate=certificate, gain_over_best_uniform=gain,
            best_uniform=best_uniform.label if best_uniform else None,
            best_uniform_kl=best_uniform.quality.kl if best_uniform else None, outcome=outcome,
            note="speed figures are cost-model predictions"
                 + (f" using measured GEMM times from {req.cost_table}" if req.cost_table else "")
                 + (f" using this machine's measured {KERNEL_TABLES[runtime][0]} kernel times"
                    + (" and non-GEMM decode step" if (measured or {}).get("non_gemm_decode_s")
                       else "") if measure_kernels else "")
                 + "; quality is measured"),
        audit=ps.Audit(calibration_source=data.source, calibration_hash=data.content_hash,
                       calibration=ps.CalibrationSettings(
                           seq_len=req.seq_len, n_calib=req.calib_blocks,
                           n_eval=req.eval_blocks, seed=req.seed, batch_size=CALIB_BATCH),
                       tensors=chosen.audit),
    )
    save_plan(plan, req.out)
    return SearchOutcome(plan, front)


__all__ = ["Reporter", "SearchOutcome", "SearchRequest", "run_search"]
