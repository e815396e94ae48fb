"""One pipeline for `autoplan search` and `autoplan compare`: one model, one or more
platforms (target x runtime), each searched through its job queue and written as a plan.

    preflight(each request)               every platform checked before any work
    prepare_shared                        the model, its tokens, one space per platform,
                                          ONE profile over their union, the original measured
    per platform: prepare_platform -> run_rounds (job queue) -> choose -> certify
                  -> build_plan -> save_plan        yields Searched
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from autoplan.cost.operating import NoOperatingPoint
from autoplan.plan import schema as ps
from autoplan.plan.io import save_plan
from autoplan.search.jobs import JobQueue, open_storage
from autoplan.search.optimize import SearchSpace
from autoplan.search.preparation import Prepared, SharedWork, prepare_platform, prepare_shared
from autoplan.search.recovery import work_dir_for
from autoplan.search.reporter import Prefixed, Reporter
from autoplan.search.request import Platform, SearchRequest, kv_options, preflight
from autoplan.search.run._record import request_record
from autoplan.search.stages import build_plan, certify, choose, run_rounds


@dataclass(frozen=True)
class Searched:
    """A platform searched: its plan is written to `req.out`."""

    req: SearchRequest
    platform: Platform
    space: SearchSpace
    plan: ps.Plan
    front: list[dict]  # the Pareto front (multi-objective), else empty
    wall_s: float  # this platform's own stages, prepare_platform to build_plan


@dataclass(frozen=True)
class Skipped:
    """A platform not searched (`skip_unfit`): not even the smallest format fits it at the
    asked batch, or no batch meets the SLO there."""

    req: SearchRequest
    reason: NoOperatingPoint


class Pipeline:
    """Search `requests` (one model and budget, one platform each) on shared model work.

    Args:
        requests: one SearchRequest per platform; the first one's model, text, seed,
            budget and settings are what the platforms share.
        reporter: progress sink.
        skip_unfit: a platform the model does not fit (or whose SLO no batch meets) is
            yielded as `Skipped` instead of refusing the whole run.
        prefix: prefix each platform's progress with its name (target.runtime).
    """

    def __init__(self, requests: Sequence[SearchRequest], reporter: Reporter | None = None,
                 *, skip_unfit: bool = False, prefix: bool = False) -> None:
        self.requests = list(requests)
        self.rep = reporter or Reporter()
        self.skip_unfit, self.prefix = skip_unfit, prefix
        self.shared: SharedWork | None = None  # set once the model work is done

    def run(self) -> Iterator[Searched | Skipped]:
        """Check every request, then search each platform that passed, in order.

        Raises:
            UserInputError: bad input, refused before the model is loaded.
        """
        t_start = time.perf_counter()
        live: list[tuple[SearchRequest, Platform]] = []
        skipped: list[Skipped] = []
        for req in self.requests:  # every platform checked before the model is loaded
            try:  # a baseline that does not fit leaves the formats that do (Platform.unfit)
                platform, unfit = preflight(req), None
            except NoOperatingPoint as exc:
                if not self.skip_unfit:
                    raise
                platform, unfit = None, exc
            if unfit is not None:
                skipped.append(Skipped(req, unfit))
            else:
                live.append((req, platform))  # type: ignore[arg-type]
        yield from skipped
        if not live:
            return
        # each platform searched with every KV cache it asks for, the runtime's own first
        groups = [kv_variants(req, platform) for req, platform in live]
        flat = [v for g in groups for v in g]
        self.shared = prepare_shared([r for r, _ in flat], [p for _, p in flat], self.rep)
        spaces = iter(self.shared.spaces)
        for (req, _platform), variants in zip(live, groups, strict=True):
            t_platform = time.perf_counter()
            done = []
            for sub, platform in variants:
                space = next(spaces)
                label = f"{platform.target.name}.{platform.runtime}" + (
                    f" kv {platform.kv.value}" if len(variants) > 1 else "")
                rep = Prefixed(self.rep, label) if self.prefix or len(variants) > 1 \
                    else self.rep
                if platform.unfit is not None:
                    rep.note(platform.unfit.describe(platform.target.name))
                prep = prepare_platform(sub, platform, self.shared, space, rep)
                # one platform alone is charged the shared work too, as `autoplan search`
                t0 = t_start if len(live) == 1 else t_platform
                plan, front = _drive(prep, rep, t0, save=len(variants) == 1)
                done.append((sub, platform, space, plan, front))
            sub, platform, space, plan, front = _best_kv(done) if len(done) > 1 else done[0]
            if len(done) > 1:
                plan = _with_alternatives(plan, done, time.perf_counter() - t_start)
                save_plan(plan, req.out)
            yield Searched(req, platform, space, plan, front, time.perf_counter() - t_platform)


def kv_variants(req: SearchRequest, platform: Platform) -> list[tuple[SearchRequest, Platform]]:
    """One (request, platform) per KV cache the request searches: the runtime's own first
    (``kv_cache=None``), then each compressed format with its own operating point; just the
    request when it searches one cache."""
    kvs = kv_options(req, platform.target, platform.runtime)
    if req.kv_cache is None or len(kvs) == 1:
        return [(req, platform)]
    out = [(dataclasses.replace(req, kv_cache=None),)]
    out += [(dataclasses.replace(req, kv_cache=(k,)),) for k in kvs[1:]]
    return [(sub, preflight(sub)) for (sub,) in out]


def _objective(plan: ps.Plan) -> float:
    """The plan's objective as a number to maximize (its own operating point's prediction)."""
    pred = plan.predicted["plan"]
    return {"throughput": pred.tokens_per_s, "cost": -pred.usd_per_1m_tokens,
            "energy": -pred.energy_j_per_token, "latency": -pred.request_latency_s,
            "tpot": -pred.tpot_s}[plan.objective]


def _best_kv(done: list) -> tuple:
    """The KV cache whose plan passes and is best by the objective (the runtime's own cache
    comes first and its plan always passes: at worst the uncompressed baseline)."""
    passing = [d for d in done if d[3].quality.budget_met]
    return max(passing or done[:1], key=lambda d: _objective(d[3]))


def _with_alternatives(plan: ps.Plan, done: list, wall_s: float) -> ps.Plan:
    """The chosen plan with every KV cache the search tried in its `kv_cache` section."""
    alts = [ps.KvAlternative(format=p.kv_cache.format if p.kv_cache else "?",
                             batch=p.workload.batch, objective=_objective(p) * (
                                 1 if p.objective == "throughput" else -1),
                             measured_kl=p.quality.kl, kl_long=p.quality.kl_long,
                             passed=p.quality.budget_met, outcome=p.search.outcome)
            for _sub, _pl, _sp, p, _f in done]
    kv = plan.kv_cache.model_copy(update={"alternatives": alts}) if plan.kv_cache else None
    search = plan.search.model_copy(update={"wall_time_s": wall_s})
    # the baseline is the original as the engine serves it (its own cache, at its own
    # batch); the uncompressed weights with the chosen cache stay beside it
    own = done[0][3].predicted["baseline"]
    predicted = dict(plan.predicted)
    if plan.kv_cache and plan.kv_cache.format != plan.kv_cache.default:
        predicted["baseline_with_plan_kv"] = predicted["baseline"].model_copy(
            update={"label": f"baseline with KV {plan.kv_cache.format}"})
    predicted["baseline"] = own
    return plan.model_copy(update={"kv_cache": kv, "search": search, "predicted": predicted})


def _drive(prep: Prepared, rep: Reporter, t0: float, *, save: bool = True
           ) -> tuple[ps.Plan, list[dict]]:
    """Stages 2-5 of one platform, driven through its job queue (`autoplan worker`
    processes may join; a second driver is refused); the plan written to `req.out` unless
    `save` is False (a KV variant: the best one is written)."""
    req, platform = prep.req, prep.platform
    storage = open_storage(platform.storage) if isinstance(platform.storage, str) \
        else platform.storage
    queue = JobQueue(storage, prep.study_name)
    with queue.driving(prep.study_name, f"wait for it, or help it with `autoplan worker "
                                        f"--storage URL --study {prep.study_name}`"):
        queue.set_attr("request", request_record(prep))
        rep.note(f"study {prep.study_name} in {platform.storage_label}: more processes can "
                 f"help with `autoplan worker --storage URL --study {prep.study_name}`")
        rounds = run_rounds(prep, rep, queue)
        chosen = choose(prep, rounds, rep)
        certificate = certify(prep, rounds, rep)
        plan = build_plan(prep, rounds, chosen, certificate, time.perf_counter() - t0)
        if save:
            save_plan(plan, req.out)
        if platform.unfit is not None and not plan.predicted["plan"].fits:
            rep.note(f"warning: the plan keeps layers at {platform.unfit.baseline} and needs "
                     f"{plan.predicted['plan'].memory_gb:,.1f} GB, more than "
                     f"{platform.unfit.usable_bytes / 1e9:,.1f} GB usable on "
                     f"{platform.target.name}: loosen the budget, or pass --choices without "
                     "the 16-bit formats")
        if req.recovery is not None:  # the chosen pass's weights now lie beside the plan
            shutil.rmtree(work_dir_for(req.out), ignore_errors=True)
        queue.set_attr("done", True)  # workers stop
    return plan, rounds.front


__all__ = ["Pipeline", "Searched", "Skipped", "kv_variants"]
