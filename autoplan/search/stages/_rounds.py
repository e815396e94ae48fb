"""Stage 2: rounds of (study on the surrogate -> verify the best candidates for real).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

from autoplan.plan import schema as ps
from autoplan.quality.evaluator import QualityResult
from autoplan.search.jobs import Job, JobQueue, drain
from autoplan.search.optimize import (
    Candidate,
    StudyConfig,
    StudyResult,
    lagrangian_allocations,
    owl_allocations,
    run_study,
)
from autoplan.search.reporter import Reporter
from autoplan.search.stages._prepare import Prepared
from autoplan.search.verify import Measurement

SAFETY = 0.9  # aim the surrogate limit 10% inside the calibrated budget
# With --recover, finalists are measured after a recovery pass, which removed about two
# thirds of uniform 2:4's KL on SmolLM2-135M (docs/lab/benchmarks.md, "Recovery"): the first
# round aims at a 3x looser surrogate limit, and the measurements refit it from there.
RECOVERED_SLOPE = 1 / 3


@dataclass(frozen=True)
class Rounds:
    """What the rounds found, for `choose`, `certify` and the plan's search record."""

    limit: float  # the last surrogate limit
    chosen: Measurement | None  # the best measured candidate that passed, if any
    best_searched: Candidate | None  # the last round's best surrogate-feasible trial
    trials: int  # trials over all rounds
    log: list[ps.Round] = field(default_factory=list)  # per round: limit, trials, verified
    front: list[dict] = field(default_factory=list)  # Pareto front (multi-objective)


def _warm_starts(prep: Prepared, limit: float) -> list:
    tables = prep.tables
    warm = [p for p in prep.uniform.values() if tables.surrogate(p) <= limit]
    warm += owl_allocations(tables, prep.profile) + lagrangian_allocations(tables, limit)
    return warm + [list(m.picks) for m in prep.verifier.measured.values()
                   if m.surrogate <= limit]


def round_study_name(study: str, k: int) -> str:
    return study if k == 0 else f"{study}-r{k}"


def _study_config(prep: Prepared, k: int, storage: object) -> StudyConfig:
    req = prep.req
    return StudyConfig(req.objective, req.trials if k == 0 else max(req.trials // 4, 1),
                       req.seed + k, round_study_name(prep.study_name, k),
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


def _settled(prep: Prepared, best: Candidate | None) -> Measurement | None:
    """The best passing measurement so far, when it ends the rounds: it is the round's best
    searched candidate or beats it (else None)."""
    passing = [m for m in prep.verifier.measured.values() if m.passed]
    if not passing:
        return None
    chosen = min(passing, key=lambda m: prep.sign * prep.value(m.picks))
    if best is None or chosen.picks == best.picks or \
            prep.sign * prep.value(chosen.picks) <= prep.sign * prep.value(best.picks):
        return chosen
    return None


def _verify(prep: Prepared, result: StudyResult, k: int, rep: Reporter,
            queue: JobQueue | None) -> list[Measurement]:
    """Measure the round's best candidates not measured yet, on the request's executor (each
    measurement is independent of the others), or through the job queue, where workers may
    measure some of them. A process measuring alone (no executor, no worker has joined)
    measures them one at a time, best first, and stops once one settles the rounds
    (`_settled`): the others could not change the plan, only cost a whole-model measurement
    each. A streamed model measures them together instead: one pass over its blocks serves
    them all."""
    verifier = prep.verifier
    todo = [c for c in result.candidates if c.picks not in verifier.measured]
    todo = todo[:prep.req.verify_top]
    labelled = [(c.picks, f"round{k + 1}-candidate{i + 1}") for i, c in enumerate(todo)]
    rep.progress("verify", 0, len(todo))
    recover = prep.req.recovery is not None
    if recover:
        verifier.check_recoverable()  # before any measurement

    def measure(items: list) -> list[Measurement]:
        if queue is None:
            return verifier.measure_many(items, prep.req.executor, recover=recover)
        return _measure_queued(prep, queue, items)

    alone = prep.req.executor is None and prep.runner.execution != "stream" and \
        (queue is None or not queue.workers())
    if not alone:
        done = measure(labelled)
        rep.progress("verify", len(todo), len(todo))
        return done
    best = result.candidates[0] if result.candidates else None
    done = []
    for item in labelled:
        done += measure([item])
        rep.progress("verify", len(done), len(todo))
        if _settled(prep, best) is not None:
            break
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


def run_rounds(prep: Prepared, rep: Reporter, queue: JobQueue | None = None) -> Rounds:
    """Search and verify until a measured plan is the best the surrogate offers (with a
    job queue: sharing the trials and measurements with the search's workers)."""
    budget, verifier, sign = prep.req.budget, prep.verifier, prep.sign
    prior = budget.prior_slope * (RECOVERED_SLOPE if prep.req.recovery is not None else 1.0)
    limit = budget.limit / prior * SAFETY
    log: list[ps.Round] = []
    front: list[dict] = []
    chosen: Measurement | None = None
    best: Candidate | None = None
    trials = 0
    for k in range(prep.req.max_rounds):
        rep.stage(f"search round {k + 1}: surrogate KL <= {limit:.4g}")
        result = run_study(prep.tables, limit, prep.cost,
                           _study_config(prep, k, queue.storage if queue else
                                         prep.platform.storage),
                           _warm_starts(prep, limit),
                           on_trial=lambda d, t: rep.progress("trials", d, t), queue=queue)
        trials += result.n_trials
        front = _front(prep, result) or front
        best = result.candidates[0] if result.candidates else None
        rep.stage(f"verifying round {k + 1}")
        checked = _verify(prep, result, k, rep, queue)
        log.append(ps.Round(round=k + 1, surrogate_limit=limit, trials=result.n_trials,
                            resumed_trials=result.resumed,
                            verified=[ps.VerifiedCandidate(label=m.label, surrogate_kl=m.surrogate,
                                                           badness=m.badness, passed=m.passed)
                                      for m in checked]))
        settled = _settled(prep, best)
        passing = [m for m in verifier.measured.values() if m.passed]
        if passing:
            chosen = min(passing, key=lambda m: sign * prep.value(m.picks))
        if settled is not None:
            break
        new_limit = budget.limit / verifier.slope(prior) * SAFETY
        limit = new_limit if new_limit < limit else limit * 0.5
        if not checked:
            break
    return Rounds(limit, chosen, best, trials, log, front)


__all__ = ["RECOVERED_SLOPE", "SAFETY", "Rounds", "measurement_result", "round_study_name",
           "run_rounds", "run_verify_jobs"]
