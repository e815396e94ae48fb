"""`autoplan search` as a library call, in stages:

    preflight -> prepare -> run_rounds -> choose -> certify -> build_plan -> save

`preflight` refuses what the arguments, the files' headers and the storage show to be wrong,
before any work; `prepare` loads, profiles and times; `run_rounds` searches the surrogate
and verifies candidates on the real model; `choose` applies the fallback policy; `certify`
solves the additive problem exactly; `build_plan` assembles the Plan, written atomically.

The process running this drives the search: it holds the study's driver job (a second
search on the same study is refused), records its request for `autoplan worker`
processes, shares the rounds' work with them through the job queue, and alone writes the
plan.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field

from autoplan.plan import schema as ps
from autoplan.plan.io import save_plan
from autoplan.search.jobs import JobQueue, open_storage
from autoplan.search.recovery import work_dir_for
from autoplan.search.reporter import Reporter
from autoplan.search.run._record import request_record
from autoplan.search.stages import (
    SearchRequest,
    build_plan,
    certify,
    choose,
    preflight,
    prepare,
    run_rounds,
)


@dataclass
class SearchOutcome:
    plan: ps.Plan
    front: list[dict] = field(default_factory=list)


def run_search(req: SearchRequest, reporter: Reporter | None = None) -> SearchOutcome:
    """Run a whole search and write its plan to `req.out`.

    Raises:
        UserInputError: bad input, refused before the work that would have found it.
    """
    rep = reporter or Reporter()
    t_start = time.perf_counter()
    platform = preflight(req)
    prep = prepare(req, platform, rep)
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
        plan = build_plan(prep, rounds, chosen, certificate, time.perf_counter() - t_start)
        save_plan(plan, req.out)
        if platform.unfit is not None and not plan.predicted["plan"].fits:
            rep.note(f"warning: the plan keeps layers at {platform.unfit.baseline} and needs "
                     f"{plan.predicted['plan'].memory_gb:,.1f} GB, more than "
                     f"{platform.unfit.usable_bytes / 1e9:,.1f} GB usable on {platform.target.name}"
                     f": loosen the budget, or pass --choices without the 16-bit formats")
        if req.recovery is not None:  # the chosen pass's weights now lie beside the plan
            shutil.rmtree(work_dir_for(req.out), ignore_errors=True)
        queue.set_attr("done", True)  # workers stop
    return SearchOutcome(plan, rounds.front)


__all__ = ["SearchOutcome", "run_search"]
