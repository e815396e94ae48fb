"""`autoplan worker`: join a running search and take its jobs (trial batches, measurements).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.backends.registry import resolve_target
from autoplan.runtimes import get_runtime
from autoplan.search.jobs import (
    POLL_S,
    Job,
    JobQueue,
    check_storage,
    journal_path,
    open_storage,
    queue_name,
    redact,
)
from autoplan.search.reporter import Reporter
from autoplan.search.storage_url import no_search
from autoplan.streaming.settings import ExecutionSettings

if TYPE_CHECKING:  # the search stack (torch, the study) is imported once a search is found
    from optuna.storages import BaseStorage

    from autoplan.search.optimize import RoundStudy, StudyConfig
    from autoplan.search.preparation import Prepared
    from autoplan.search.request import Platform


@dataclass
class WorkerReport:
    trials: int = 0  # surrogate trials this worker stored
    batches: int = 0
    verified: int = 0
    reason: str = ""  # why it stopped


def _wait_for_record(open_store: Callable[[], BaseStorage | None], study: str, label: str,
                     wait_s: float, rep: Reporter) -> tuple[BaseStorage, JobQueue, dict]:
    """The storage, the search's job queue and its recorded request, once the search has
    started; ``open_store`` gives None while there is no storage to open yet."""
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        storage = open_store()
        try:
            if storage is not None:
                storage.get_study_id_from_name(queue_name(study))
        except KeyError:
            pass
        else:
            if storage is not None:
                queue = JobQueue(storage, study)
                rec = queue.attr("request")
                if rec is not None:
                    return storage, queue, rec
        if time.monotonic() > deadline:
            raise no_search(study, label, wait_s)
        if not waiting:  # said only when there is something to wait for
            rep.note(f"no search named {study} in {label} yet: waiting up to {wait_s:g} s "
                     "for it to start (--wait)")
            rep.stage(f"waiting for search {study}")
            waiting = True
        time.sleep(1.0)


def _opener(url: str) -> Callable[[], BaseStorage | None]:
    """Opens ``url`` once it can be: a journal file only once the search has created it, so
    a worker that finds no search leaves no journal (and no folder) behind."""
    opened: list[BaseStorage] = []
    journal = journal_path(url)

    def open_store() -> BaseStorage | None:
        if not opened and (journal is None or journal.is_file()):
            opened.append(open_storage(url))
        return opened[0] if opened else None

    return open_store


def _platform(rec: dict, storage: BaseStorage, label: str) -> Platform:
    from autoplan.search.request import Platform, check_model

    target = resolve_target(rec["target"])
    runtime = get_runtime(rec["runtime"]).name
    check_model(rec["model"], runtime)
    return Platform(target, runtime, False, storage, label)


def run_worker(storage: str | BaseStorage, study: str,
               execution: ExecutionSettings | None = None, reporter: Reporter | None = None,
               wait_s: float = 120.0) -> WorkerReport:
    """Work for the search `study` in `storage` until it is done (or its driver has been
    gone for `wait_s` seconds).

    Raises:
        UserInputError: the storage cannot be opened, no such search appears within
            `wait_s`, or this machine's model or text differ from the search's.
    """
    rep = reporter or Reporter()
    from autoplan.streaming.device import resolve_device

    resolve_device((execution or ExecutionSettings()).device)  # before any waiting
    if isinstance(storage, str):
        check_storage(storage)
        label, open_store = redact(storage), _opener(storage)
    else:
        label, given = type(storage).__name__, storage
        open_store = lambda: given  # noqa: E731
    storage, queue, rec = _wait_for_record(open_store, study, label, wait_s, rep)
    from autoplan.search.optimize import RoundStudy, run_batch
    from autoplan.search.preparation import prepare
    from autoplan.search.run._record import check_same_inputs, request_from_record
    from autoplan.search.stages import run_verify_jobs
    from autoplan.search.verify import scaled_tables

    req, profile = request_from_record(rec, storage, execution or ExecutionSettings())
    prep = prepare(req, _platform(rec, storage, label), rep, profile=profile)
    check_same_inputs(rec, prep)
    queue.set_attr(f"worker:{queue.worker}", {"joined": time.time()})  # who helped
    report = WorkerReport()
    studies: dict[str, RoundStudy] = {}

    def run(job: Job) -> None:
        if job.kind == "verify":
            rep.stage(f"measuring {job.attrs['label']}")
            run_verify_jobs(prep, queue, [job])
            report.verified += 1
            return
        name = job.attrs["study"]
        if name not in studies:
            # the round's calibrated problem (raw tables for a batch that carries none)
            tables = scaled_tables(prep.tables, job.attrs.get("scales", {}),
                                   float(job.attrs.get("base", 1.0)))
            studies[name] = RoundStudy(tables, float(job.attrs["limit"]), prep.cost,
                                       _config(prep, name), storage)
        before = studies[name].stored_here
        run_batch(queue, job, studies[name])
        report.trials += studies[name].stored_here - before
        report.batches += 1
        rep.progress("trials", report.trials, report.trials)

    report.reason = _serve(queue, run, study, wait_s, rep)
    return report


def _serve(queue: JobQueue, run: Callable[[Job], None], study: str, wait_s: float,
           rep: Reporter) -> str:
    """Run the queue's trial and verification jobs until the search is done or its driver
    has been gone `wait_s` seconds; why it stopped. An empty queue is said, not silent: the
    first time as a note (how long without a driver ends it), then as the stage."""
    rep.stage(f"working for {study}")
    driver_seen = time.monotonic()
    idle, told = False, False
    while True:
        queue.fail_stale()
        with queue.claim(lambda j: j.kind in ("trials", "verify")) as job:
            if job is not None:
                if idle:
                    rep.stage(f"working for {study}")
                idle = False
                run(job)
                continue
        if queue.attr("done"):
            return "the search is done"
        if queue.driver_alive():
            driver_seen = time.monotonic()
        elif time.monotonic() - driver_seen > wait_s:
            return f"no search has driven {study} for {wait_s:g} s"
        if not idle:
            if not told:
                rep.note(f"no job for this worker now: waiting for the search {study} to queue "
                         f"trials or verifications (stops when it is done, or after {wait_s:g} s "
                         "without its driver)")
                told = True
            rep.stage(f"waiting for work from {study}")
            idle = True
        time.sleep(POLL_S)


def _config(prep: Prepared, name: str) -> StudyConfig:
    """The round study's config in a worker: the driver's objective, a sampler seeded for
    this process (workers sharing one seed would propose the same moves)."""
    from autoplan.search.optimize import StudyConfig

    req = prep.req
    return StudyConfig(req.objective, req.trials, int.from_bytes(os.urandom(4), "little") >> 1,
                       name, None, req.multi_objective)


__all__ = ["WorkerReport", "run_worker"]
