"""One pipeline for `autoplan search` and `autoplan compare`: one model, one or more
platforms (target x runtime), each searched through its job queue and written as a plan.

    preflight(each request)               every platform checked before any work
    prepare_shared                        the model, its tokens, one space per platform,
                                          ONE profile over their union, the original measured
    per platform: prepare_platform -> run_rounds (job queue) -> choose -> certify
                  -> build_plan -> save_plan        yields Searched
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from autoplan.cost.operating import NoOperatingPoint
from autoplan.plan import schema as ps
from autoplan.plan.io import save_plan
from autoplan.search.jobs import JobQueue, open_storage
from autoplan.search.optimize import SearchSpace
from autoplan.search.recovery import work_dir_for
from autoplan.search.reporter import Prefixed, Reporter
from autoplan.search.run._record import request_record
from autoplan.search.stages import (
    Platform,
    Prepared,
    SearchRequest,
    SharedWork,
    build_plan,
    certify,
    choose,
    preflight,
    prepare_platform,
    prepare_shared,
    run_rounds,
)


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
        reqs, platforms = [r for r, _ in live], [p for _, p in live]
        self.shared = prepare_shared(reqs, platforms, self.rep)
        for req, platform, space in zip(reqs, platforms, self.shared.spaces, strict=True):
            t_platform = time.perf_counter()
            rep = Prefixed(self.rep, f"{platform.target.name}.{platform.runtime}") \
                if self.prefix else self.rep
            if platform.unfit is not None:
                rep.note(platform.unfit.describe(platform.target.name))
            prep = prepare_platform(req, platform, self.shared, space, rep)
            # one platform alone is charged the shared work too, as `autoplan search` reports
            t0 = t_start if len(live) == 1 else t_platform
            plan, front = _drive(prep, rep, t0)
            yield Searched(req, platform, space, plan, front, time.perf_counter() - t_platform)


def _drive(prep: Prepared, rep: Reporter, t0: float) -> tuple[ps.Plan, list[dict]]:
    """Stages 2-5 of one platform, driven through its job queue (`autoplan worker`
    processes may join; a second driver is refused); the plan written to `req.out`."""
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


__all__ = ["Pipeline", "Searched", "Skipped"]
