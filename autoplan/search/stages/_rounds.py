"""Stage 2: rounds of (calibrate -> study on the calibrated surrogate -> verify).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

from autoplan.plan import schema as ps
from autoplan.quality.evaluator import QualityResult
from autoplan.search.jobs import Job, JobQueue, drain
from autoplan.search.optimize import (
    Candidate,
    StudyConfig,
    StudyResult,
    Tables,
    lagrangian_allocations,
    owl_allocations,
    run_study,
)
from autoplan.search.reporter import Reporter
from autoplan.search.preparation import Prepared
from autoplan.search.stages._uniform import acceptable, best_uniform
from autoplan.search.verify import Calibration, Measurement, family_shares

SAFETY = 0.9  # aim the calibrated limit 10 % inside the budget
USED = 0.85  # the budget is used: the best acceptable measurement is within 15 % of it
AIM_RANGE = (0.3, 1.5)  # how far one round's correction may move the aim
# With --recover, finalists are measured after a recovery pass, which removed about two
# thirds of uniform 2:4's KL on SmolLM2-135M (docs/lab/benchmarks.md, "Recovery"): the first
# round aims at a 3x looser surrogate limit, and the measurements refit it from there.
RECOVERED_SLOPE = 1 / 3


@dataclass(frozen=True)
class Rounds:
    """What the rounds found, for `choose`, `certify` and the plan's search record."""

    limit: float  # the last limit on the calibrated surrogate (predicted badness)
    chosen: Measurement | None  # the best measured candidate that passed, if any
    best_searched: Candidate | None  # the last round's best calibrated-feasible trial
    trials: int  # trials over all rounds
    log: list[ps.Round] = field(default_factory=list)  # per round: limit, calibration, ...
    front: list[dict] = field(default_factory=list)  # Pareto front (multi-objective)
    calibration: Calibration | None = None  # the last round's (the certificate's problem)
    stopped: str = ""  # why the rounds ended


def _warm_starts(prep: Prepared, tables: Tables, limit: float) -> list:
    warm = [p for p in prep.uniform.values() if tables.surrogate(p) <= limit]
    warm += owl_allocations(tables, prep.profile) + lagrangian_allocations(tables, limit)
    return warm + [list(m.picks) for m in prep.verifier.measured.values()
                   if tables.surrogate(m.picks) <= limit]


def round_study_name(study: str, k: int, cal: Calibration | None = None) -> str:
    """Round k's study: a later round's name carries a digest of its calibration, which
    sets its trials' values, so a re-run resumes it only where it measured the same."""
    if k == 0:
        return study
    tag = hashlib.sha256(json.dumps(cal.to_json() if cal else {}, sort_keys=True)
                         .encode()).hexdigest()[:8]
    return f"{study}-r{k}-{tag}"


def _study_config(prep: Prepared, k: int, storage: object, cal: Calibration) -> StudyConfig:
    req = prep.req
    return StudyConfig(req.objective, req.trials if k == 0 else max(req.trials // 4, 1),
                       req.seed + k, round_study_name(prep.study_name, k, cal),
                       storage, req.multi_objective, sampler=req.sampler)


def measurement_result(m: Measurement) -> dict:
    """A measurement as a verify job's result (JSON)."""
    return {"quality": asdict(m.quality), "audit": m.audit}


def run_verify_jobs(prep: Prepared, queue: JobQueue, jobs: list[Job],
                    rep: Reporter | None = None, total: int = 0) -> None:
    """Measure claimed verify jobs (on the request's executor, all at once) and post them."""
    done = prep.verifier.measure_many(
        [(tuple(j.attrs["picks"]), j.attrs["label"]) for j in jobs], prep.req.executor,
        on_done=(lambda d: rep.progress("verify", d, total)) if rep else None)
    for job, m in zip(jobs, done, strict=True):
        queue.complete(job, measurement_result(m))


def speed_gain(prep: Prepared, picks, than) -> float:  # noqa: ANN001 - pick sequences
    """How many times faster (by the objective, predicted) `picks` is than `than`."""
    a, b = prep.value(picks), prep.value(than)
    return a / b if prep.sign < 0 else b / a


def incumbent(prep: Prepared) -> Measurement | None:
    """The fastest acceptable measurement so far (passing, or the model as is)."""
    ok = [m for m in prep.verifier.measured.values() if acceptable(prep, m)]
    return min(ok, key=lambda m: prep.sign * prep.value(m.picks)) if ok else None


def _worth_measuring(prep: Prepared, result: StudyResult, best: Measurement | None
                     ) -> list[Candidate]:
    """The round's candidates not measured yet and faster than `best` by more than the
    speed prediction's uncertainty, best first: any other could not be planned (the noise
    rule in `choose` would return `best`, or a better-quality one, instead)."""
    bar = 1.0 + prep.uncertainty.relative
    return [c for c in result.candidates if c.picks not in prep.verifier.measured
            and (best is None or speed_gain(prep, c.picks, best.picks) > bar)]


def _verify(prep: Prepared, todo: list[Candidate], k: int, rep: Reporter,
            queue: JobQueue | None) -> list[Measurement]:
    """Measure the round's best candidates worth measuring, on the request's executor (each
    measurement is independent of the others), or through the job queue, where workers may
    measure some of them: `verify_top` of them. A process measuring alone (no executor, no
    worker has joined) measures only the best one: the next round re-fits the calibration
    on it before choosing another. A streamed model measures `verify_top` together: one
    pass over its blocks serves them all."""
    verifier = prep.verifier
    alone = prep.req.executor is None and prep.runner.execution != "stream" and \
        (queue is None or not queue.workers())
    todo = todo[:1 if alone else prep.req.verify_top]
    labelled = [(c.picks, f"round{k + 1}-candidate{i + 1}") for i, c in enumerate(todo)]
    rep.progress("verify", 0, len(todo))
    recover = prep.req.recovery is not None
    if recover:
        verifier.check_recoverable()  # before any measurement
    if queue is None:
        done = verifier.measure_many(labelled, prep.req.executor, recover=recover)
    else:
        done = _measure_queued(prep, queue, labelled)
    rep.progress("verify", len(todo), len(todo))
    return done


def _measure_queued(prep: Prepared, queue: JobQueue, labelled: list) -> list[Measurement]:
    """Measure these (picks, label) through the job queue: this process runs the jobs no
    worker has claimed and waits for the rest."""
    verifier = prep.verifier
    keys = {queue.submit_verify(p, label): (p, label) for p, label in labelled}

    # With an executor, everything still waiting goes to it at once; so it does for a
    # streamed model, which measures several candidates in one pass over its blocks.
    batch = prep.req.executor is not None or prep.runner.execution == "stream"

    def claim_and_measure(first: Job) -> None:
        with ExitStack() as held:
            jobs = [first]
            while batch:
                job = held.enter_context(queue.claim(mine))
                if job is None:
                    break
                jobs.append(job)
            run_verify_jobs(prep, queue, jobs)

    def mine(job: Job) -> bool:
        return job.kind == "verify" and job.attrs.get("key") in keys

    drain(queue, lambda: len(queue.results(list(keys))) == len(keys), mine, claim_and_measure)
    for key, posted in queue.results(list(keys)).items():
        p, label = keys[key]
        if tuple(p) not in verifier.measured:
            verifier.record(p, label, QualityResult(**posted["quality"]), posted["audit"])
    # Recovery passes run here, in the driver, after the (unrecovered) measurements: the
    # workers measure, the pass trains beside the plan this process writes.
    verifier.recover([tuple(p) for p, _ in labelled] if prep.req.recovery is not None else [])
    return [verifier.measured[tuple(p)] for p, _ in labelled]


def _front(prep: Prepared, result: StudyResult) -> list[dict]:
    return [{"value": c.value, "surrogate_kl": c.surrogate,
             "decisions": {u: str(ch) for u, ch in prep.tables.choices_of(c.picks).items()}}
            for c in result.front]


def _next_aim(prep: Prepared, cal: Calibration, checked: list[Measurement],
              aim: float) -> float:
    """The next round's aim (limit / budget): SAFETY over the calibrated surrogate's
    remaining error on the round's measurement nearest the budget (above 1: it still
    under-predicts, the aim moves down; below 1: it over-predicts, the aim moves up)."""
    limit = prep.req.budget.limit
    full = [m for m in checked if not m.quality.stopped_early and m.badness > 0]
    if not full:
        return aim
    near = min(full, key=lambda m: abs(math.log(m.badness / limit)))
    predicted = cal.predict(family_shares(prep.tables, near.picks))
    if predicted <= 0:
        return aim
    return min(max(SAFETY * predicted / near.badness, AIM_RANGE[0]), AIM_RANGE[1])


def _round_entry(k: int, study: str, limit: float, aim: float, cal: Calibration,
                 result: StudyResult, checked: list[Measurement], tables: Tables) -> ps.Round:
    return ps.Round(round=k + 1, study=study, surrogate_limit=limit, aim=aim,
                    calibration=cal.to_json(), trials=result.n_trials,
                    resumed_trials=result.resumed,
                    verified=[ps.VerifiedCandidate(label=m.label, surrogate_kl=m.surrogate,
                                                   predicted=tables.surrogate(m.picks),
                                                   badness=m.badness, passed=m.passed)
                              for m in checked])


def run_rounds(prep: Prepared, rep: Reporter, queue: JobQueue | None = None) -> Rounds:
    """Calibrate, search and verify until the budget is used or nothing faster is left
    (with a job queue: sharing the trials and measurements with the search's workers)."""
    budget, verifier = prep.req.budget, prep.verifier
    prior = budget.prior_slope * (RECOVERED_SLOPE if prep.req.recovery is not None else 1.0)
    best_uniform(prep, rep)  # the first measurements: they calibrate round 1
    leave_out = [prep.as_is.picks] if prep.as_is.quantized_source else []
    log: list[ps.Round] = []
    front: list[dict] = []
    best: Candidate | None = None
    trials, aim, limit = 0, SAFETY, budget.limit * SAFETY
    cal = verifier.calibration(prior, leave_out)
    stopped = f"round limit: {prep.req.max_rounds} rounds ran"
    for k in range(prep.req.max_rounds):
        cal = verifier.calibration(prior, leave_out)
        tables = cal.tables(prep.tables)
        limit = budget.limit * aim
        rep.stage(f"search round {k + 1}: predicted {budget.metric} <= {limit:.4g}")
        cfg = _study_config(prep, k, queue.storage if queue else prep.platform.storage, cal)
        result = run_study(tables, limit, prep.cost, cfg,
                           _warm_starts(prep, tables, limit),
                           on_trial=lambda d, t: rep.progress("trials", d, t), queue=queue,
                           batch_attrs={"scales": cal.scales, "base": cal.base})
        trials += result.n_trials
        front = _front(prep, result) or front
        best = result.candidates[0] if result.candidates else None
        held = incumbent(prep)
        todo = _worth_measuring(prep, result, held)
        if not todo:
            log.append(_round_entry(k, cfg.study_name, limit, aim, cal, result, [], tables))
            stopped = _nothing_faster(prep, result, held)
            break
        rep.stage(f"verifying round {k + 1}")
        checked = _verify(prep, todo, k, rep, queue)
        log.append(_round_entry(k, cfg.study_name, limit, aim, cal, result, checked, tables))
        held = incumbent(prep)
        if held is not None and held.badness >= USED * budget.limit:
            stopped = (f"budget used: the best measurement that passes ({held.label}) is at "
                       f"{held.badness:.4g}, at least {USED:.0%} of the budget "
                       f"{budget.limit:g}")
            break
        aim = _next_aim(prep, verifier.calibration(prior, leave_out), checked, aim)
    passing = [m for m in verifier.measured.values() if m.passed]
    chosen = min(passing, key=lambda m: prep.sign * prep.value(m.picks)) if passing else None
    return Rounds(limit, chosen, best, trials, log, front, cal, stopped)


def _nothing_faster(prep: Prepared, result: StudyResult, held: Measurement | None) -> str:
    """Why a round found nothing to measure (the plan's `search.stopped`)."""
    if held is None:
        return "no candidate: every candidate the calibrated problem offers is measured"
    u = prep.uncertainty.relative
    faster = [c for c in result.candidates
              if speed_gain(prep, c.picks, held.picks) > 1.0 + u]
    if not faster:
        top = speed_gain(prep, result.candidates[0].picks, held.picks) \
            if result.candidates else 1.0
        return (f"no faster candidate: the calibrated problem's best is {top:.3f}x "
                f"{held.label}, within the speed prediction's uncertainty (+-{u:.1%})"
                if top > 1.0 else
                f"no faster candidate: the calibrated problem's best is not faster than "
                f"{held.label}")
    return (f"converged: the {len(faster)} candidate(s) faster than {held.label} by more "
            f"than the uncertainty (+-{u:.1%}) are measured already")


__all__ = ["AIM_RANGE", "RECOVERED_SLOPE", "SAFETY", "USED", "Rounds", "incumbent",
           "measurement_result", "round_study_name", "run_rounds", "run_verify_jobs",
           "speed_gain"]
