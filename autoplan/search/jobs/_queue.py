"""The job queue the processes of one search share: each job is a trial of the study
`S.jobs` beside the round studies in the same Optuna storage ("trials": a batch of surrogate
trials, "verify": one candidate to measure, "driver": held by the search while it runs).
Claiming is Optuna's atomic WAITING -> RUNNING; a job whose heartbeat stops is re-queued.
docs/architecture.md, "Many workers, one search", says how.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, fail_stale_trials
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import FrozenTrial, TrialState

from autoplan.errors import UserInputError
from autoplan.search.jobs._storage import GRACE_S, load_or_create, retry_stale_job

BATCH = 25  # surrogate trials per job: few jobs to scan, little work redone after a kill
POLL_S = 0.2  # how often a process with nothing to claim looks again
_QUEUE_SUFFIX = ".jobs"


def queue_name(study: str) -> str:
    return study + _QUEUE_SUFFIX


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None when it is
    gone or a zombie: with the pid it names one process, even after the pid is reused."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one read of a tiny file
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def worker_id() -> str:
    """host/pid/start: who holds a job, precise enough to tell that it is dead."""
    return f"{socket.gethostname()}/{os.getpid()}/{_start_ticks(os.getpid()) or '?'}"


def process_alive(worker: str) -> bool:
    """False only for a process on this machine that has exited (or was killed); a process
    on another machine is judged by its heartbeat instead."""
    host, pid, start = (worker.split("/") + ["", "", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    if os.path.isdir("/proc"):
        return _start_ticks(int(pid)) == start if start != "?" else \
            _start_ticks(int(pid)) is not None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stamp(when: datetime | None) -> str:
    return when.isoformat() if when else ""


def picks_key(picks: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(picks)).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Job:
    trial_id: int
    number: int
    attrs: dict[str, Any]  # kind and inputs (user attributes)
    retry: bool  # a re-queued copy of a job whose process died

    @property
    def kind(self) -> str:
        return self.attrs["kind"]


class JobQueue:
    """The queue study of one search (see module doc)."""

    def __init__(self, storage: BaseStorage, study: str) -> None:
        self.storage, self.name = storage, queue_name(study)
        self.study = load_or_create(storage, self.name, ["minimize"])
        self.study_id = storage.get_study_id_from_name(self.name)
        self.worker = worker_id()

    # ---- study-wide records ------------------------------------------------------------
    def attr(self, key: str, default: Any = None) -> Any:
        return self.storage.get_study_user_attrs(self.study_id).get(key, default)

    def set_attr(self, key: str, value: Any) -> None:
        self.storage.set_study_user_attr(self.study_id, key, value)

    def jobs(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=states)

    # ---- creating work -----------------------------------------------------------------
    def _add(self, attrs: dict[str, Any], state: TrialState = TrialState.WAITING) -> int:
        template = optuna.trial.FrozenTrial(
            number=-1, state=state, value=None, values=None,
            datetime_start=datetime.now() if state == TrialState.RUNNING else None,
            datetime_complete=None, params={}, distributions={}, user_attrs=attrs,
            system_attrs={}, intermediate_values={}, trial_id=-1)
        return self.storage.create_new_trial(self.study_id, template)

    def _own(self, trial_id: int) -> None:
        """Record who holds a job just set RUNNING (the claim's start time names the claim,
        so a re-queued copy's old owner is never taken for its new one)."""
        start = self.storage.get_trial(trial_id).datetime_start
        self.storage.set_trial_system_attr(trial_id, "owner",
                                           {"worker": self.worker, "claimed": _stamp(start)})

    def plan_batches(self, study: str, total: int, stored: int, extra: dict[str, Any]) -> None:
        """Make sure `study` gets exactly `total` trials: batches covering what `stored` (the
        trials it already holds) leaves, planned once and recorded, so a re-run (or a larger
        `total`) creates only the batches still missing. `extra` goes into every batch."""
        key = f"plan:{study}"
        plan = self.attr(key) or {"total": stored, "sizes": []}
        if total > plan["total"]:
            more = total - plan["total"]
            plan = {"total": total, "sizes": plan["sizes"] + [
                min(BATCH, more - i) for i in range(0, more, BATCH)]}
            self.set_attr(key, plan)  # first: a batch is never created twice from two plans
        made = {t.user_attrs.get("batch") for t in self.jobs()
                if t.user_attrs.get("study") == study}
        for i, size in enumerate(plan["sizes"]):
            batch = f"{study}#{i}"
            if batch not in made:
                self._add({"kind": "trials", "study": study, "batch": batch, "size": size,
                           "index": i, **extra})

    def batches_done(self, study: str) -> bool:
        plan = self.attr(f"plan:{study}") or {"sizes": []}
        done = {t.user_attrs.get("batch") for t in self.jobs((TrialState.COMPLETE,))}
        return all(f"{study}#{i}" in done for i in range(len(plan["sizes"])))

    def submit_verify(self, picks: Sequence[int], label: str) -> str:
        """Queue one candidate's measurement, unless it is queued or measured already;
        returns its key."""
        key = picks_key(picks)
        live = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
        if not any(t.user_attrs.get("key") == key for t in self.jobs(live)):
            self._add({"kind": "verify", "key": key, "picks": list(picks), "label": label})
        return key

    def results(self, keys: Sequence[str]) -> dict[str, dict]:
        """The measurements posted for these keys so far."""
        wanted = set(keys)
        return {t.user_attrs["key"]: t.user_attrs["result"]
                for t in self.jobs((TrialState.COMPLETE,))
                if t.user_attrs.get("key") in wanted and "result" in t.user_attrs}

    # ---- claiming ----------------------------------------------------------------------
    @contextmanager
    def claim(self, accept: Callable[[Job], bool]) -> Iterator[Job | None]:
        """Hold the first WAITING job `accept` takes (None: none) with a heartbeat, for the
        `with` body; the body finishes it with `complete`. A job the body leaves unfinished
        (an exception) is failed and re-queued."""
        job = self._pop(accept)
        if job is None:
            yield None
            return
        ok = False
        try:
            with get_heartbeat_thread(job.trial_id, self.storage):
                yield job
            ok = True
        finally:
            if not ok:
                self._give_up(job.trial_id)

    def _pop(self, accept: Callable[[Job], bool]) -> Job | None:
        for t in self.jobs((TrialState.WAITING,)):
            job = Job(t._trial_id, t.number, dict(t.user_attrs), "failed_trial" in t.system_attrs)
            if not accept(job):
                continue
            try:
                if not self.storage.set_trial_state_values(t._trial_id, TrialState.RUNNING):
                    continue  # another process claimed it first
            except UpdateFinishedTrialError:
                continue
            self._own(t._trial_id)
            return job
        return None

    def still_mine(self, job: Job) -> bool:
        """False once another process has failed this job as stale (it will be redone)."""
        return self.storage.get_trial(job.trial_id).state == TrialState.RUNNING

    def complete(self, job: Job, result: dict[str, Any] | None = None) -> bool:
        """Finish a held job (with its result); False if it was failed as stale meanwhile."""
        try:
            if result is not None:
                self.storage.set_trial_user_attr(job.trial_id, "result", result)
            return self.storage.set_trial_state_values(job.trial_id, TrialState.COMPLETE, [0.0])
        except UpdateFinishedTrialError:
            return False

    def _give_up(self, trial_id: int) -> None:
        try:
            if self.storage.set_trial_state_values(trial_id, TrialState.FAIL):
                retry_stale_job(self.study, self.storage.get_trial(trial_id))
        except UpdateFinishedTrialError:
            pass

    # ---- stale jobs --------------------------------------------------------------------
    def fail_stale(self) -> None:
        """Fail and re-queue jobs whose holder is gone: by heartbeat (Optuna's, where the
        storage records them), or at once for a dead process on this machine."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            fail_stale_trials(self.study)
        now = datetime.now()
        for t in self.jobs((TrialState.RUNNING,)):
            owner = t.system_attrs.get("owner") or {}
            if owner.get("claimed") == _stamp(t.datetime_start):
                gone = not process_alive(owner.get("worker", ""))
            else:  # claimed but its owner never recorded: killed in between
                gone = t.datetime_start is not None and \
                    (now - t.datetime_start).total_seconds() > GRACE_S
            if gone:
                self._give_up(t._trial_id)

    # ---- the driver's lease ------------------------------------------------------------
    @contextmanager
    def driving(self, study: str, fix: str) -> Iterator[None]:
        """Hold the search's driver job for the `with` body; refused (UserInputError naming
        `fix`) while another live process drives this study."""
        self.fail_stale()
        mine = self._add({"kind": "driver"}, TrialState.RUNNING)
        self._own(mine)
        me = self.storage.get_trial(mine)
        others = [t for t in self.jobs((TrialState.RUNNING,))
                  if t.user_attrs.get("kind") == "driver" and t.number < me.number]
        if others:
            self.storage.set_trial_state_values(mine, TrialState.FAIL)
            holder = (others[0].system_attrs.get("owner") or {}).get("worker", "?")
            raise UserInputError(f"study {study} is already being searched (by {holder}): "
                                 f"{fix}")
        self.set_attr("done", False)
        try:
            with get_heartbeat_thread(mine, self.storage):
                yield
        finally:
            try:
                self.storage.set_trial_state_values(mine, TrialState.COMPLETE, [0.0])
            except UpdateFinishedTrialError:
                pass

    def workers(self) -> list[str]:
        """The workers that have joined this search (ready to take jobs)."""
        return [k.removeprefix("worker:") for k in
                self.storage.get_study_user_attrs(self.study_id) if k.startswith("worker:")]

    def driver_alive(self) -> bool:
        return any(t.user_attrs.get("kind") == "driver"
                   for t in self.jobs((TrialState.RUNNING,)))


def drain(queue: JobQueue, finished: Callable[[], bool], accept: Callable[[Job], bool],
          run: Callable[[Job], None]) -> None:
    """Until `finished()`: re-queue stale jobs, claim one `accept` takes and `run` it, or wait
    for the processes holding the rest."""
    while not finished():
        queue.fail_stale()
        with queue.claim(accept) as job:
            if job is not None:
                run(job)
                continue
        time.sleep(POLL_S)


__all__ = ["BATCH", "POLL_S", "Job", "JobQueue", "drain", "picks_key", "process_alive",
           "queue_name", "worker_id"]
