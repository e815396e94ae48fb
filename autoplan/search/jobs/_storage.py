"""The Optuna storage a search keeps its trials and job queue in: a journal file beside the
plan by default (fsynced at most every 10 s), or any Optuna URL (SQLite, PostgreSQL); the
storages opened here record heartbeats for the jobs a process holds, so a killed process's
job is retried. Costs per trial: benchmarks/storage_speed.py.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import (
    BaseStorage,
    JournalStorage,
    RDBStorage,
    RetryHeartbeatStaleTrialCallback,
)
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock, get_lock_file
from optuna.trial import FrozenTrial, TrialState

from autoplan.errors import UserInputError
from autoplan.search.storage_url import check_rdb_driver, redact, storage_error
from autoplan.search.writable import JOURNAL_PREFIX, check_journal, journal_path

# A process holding a job records a heartbeat this often (seconds); a job whose heartbeat
# is older than the grace period is failed and re-queued by whichever process looks next.
HEARTBEAT_S = 5
GRACE_S = 30
FSYNC_S = 10.0  # a journal reaches the disk at least this often (SyncedJournalFile)


def default_storage_url(plan_path: str | Path) -> str:
    p = Path(plan_path)
    return f"{JOURNAL_PREFIX}{p.with_name(p.stem + '.optuna.journal')}"


def check_storage(url: str) -> None:
    """Validate a storage URL and reach its database, before any search work is done.

    A journal file: its folder must exist or be creatable and be writable (nothing is
    created, so a search refused later leaves no empty journal behind). An RDB URL: the
    dialect must be known, its driver importable, and the database reachable (opened once
    through Optuna, which also checks its schema version). Every message is one line and
    never holds the password.

    Raises:
        UserInputError: the URL is malformed, names an unknown database, its driver is not
            installed (the message names the package), or the database cannot be opened.
    """
    if check_journal(url):
        return
    check_rdb_driver(url)
    open_storage(url)


class FlockJournalLock(BaseJournalFileLock):
    """The journal's write lock as an flock(2) on a sidecar file: the kernel releases it when
    its holder dies, so a process killed mid-write never stalls the others (Optuna's default
    symlink lock is only broken after its 30 s grace period). Needs a file system with
    flock: local disks, and NFSv4; pass a JournalStorage object for anything else."""

    def __init__(self, journal: str) -> None:
        self._path, self._fd = journal + ".flock", -1

    def acquire(self) -> bool:
        import fcntl

        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        import fcntl

        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1


class SyncedJournalFile(JournalFileBackend):
    """Optuna's journal file, whose appends reach the disk (fsync) at most every `FSYNC_S`
    seconds instead of once each. Every append is still written to the OS under the lock
    before it returns, so other processes read it at once and a killed process loses
    nothing; only a machine that loses power can lose the last seconds of trials, which a
    re-run redoes. One fsync per stored trial cost 17-700 ms on the shared 2-core machine
    under other jobs' disk load, against 1.5 ms of CPU for sampling the trial (measured; a
    6-target compare stores ~15,000)."""

    def __init__(self, file_path: str, lock_obj: BaseJournalFileLock | None = None) -> None:
        super().__init__(file_path, lock_obj)
        self._synced = time.monotonic()

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        with get_lock_file(self._lock), open(self._file_path, "ab") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            if time.monotonic() - self._synced >= FSYNC_S:
                os.fsync(f.fileno())
                self._synced = time.monotonic()


def retry_stale_job(study: optuna.Study, trial: FrozenTrial) -> None:
    """Re-queue a failed job (same attributes, WAITING): Optuna's retry callback, except for
    the search's own "driver" job, which only its process can hold."""
    if trial.user_attrs.get("kind") != "driver":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            RetryHeartbeatStaleTrialCallback()(study, trial)


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """A journal file whose RUNNING trials carry heartbeats, as Optuna's RDBStorage does, so
    `optuna.storages.fail_stale_trials` fails a killed process's jobs here too. The beat is
    a trial system attribute holding this machine's clock: processes on other machines
    sharing the file need clocks within the grace period of each other."""

    def __init__(self, backend: JournalFileBackend, heartbeat_interval: int, grace_period: int,
                 stale_callback: Callable[[optuna.Study, FrozenTrial], None]) -> None:
        super().__init__(backend)
        self._interval, self._grace, self._callback = heartbeat_interval, grace_period, \
            stale_callback

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, "heartbeat", time.time())
        except UpdateFinishedTrialError:
            pass  # failed by another process as stale: its holder stops at its next check

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            started = t.datetime_start.timestamp() if t.datetime_start else now
            beat = max(float(t.system_attrs.get("heartbeat", 0.0)), started)
            if now - beat > self._grace:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int:
        return self._interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None]:
        return self._callback


def open_storage(url: str, *, heartbeat_s: int = HEARTBEAT_S,
                 grace_s: int = GRACE_S) -> BaseStorage:
    """`journal:PATH` (or a path ending in .journal) -> journal file; else an RDB URL. Both
    record heartbeats for held jobs (every `heartbeat_s`; stale after `grace_s`)."""
    path = journal_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FlockJournalLock(str(path)) if os.name == "posix" else None
        return HeartbeatJournalStorage(SyncedJournalFile(str(path), lock), heartbeat_s,
                                       grace_s, retry_stale_job)
    check_rdb_driver(url)
    for attempt in range(_CREATE_TRIES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval
                # pool_pre_ping: a connection the server dropped while a worker was busy is
                # replaced instead of failing the next write.
                return RDBStorage(url, engine_kwargs={"pool_pre_ping": True},
                                  heartbeat_interval=heartbeat_s, grace_period=grace_s,
                                  heartbeat_stale_trial_callback=retry_stale_job)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises many types
            if _lost_create_race(exc) and attempt + 1 < _CREATE_TRIES:
                time.sleep(0.2 * (attempt + 1))  # another process created the tables: reopen
                continue
            raise UserInputError(f"cannot open storage {redact(url)}: "
                                 f"{storage_error(exc, url)}") from None
    raise AssertionError("unreachable")


# Processes opening one new database at once all create Optuna's tables; the losers of that
# race fail with a duplicate-key or already-exists error and succeed when they reopen.
_CREATE_TRIES = 5


def _lost_create_race(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 8:  # Optuna wraps the driver's error: follow the chain
        text = str(getattr(exc, "orig", None) or exc).lower()
        if "duplicate key" in text or "already exists" in text or "unique constraint" in text:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def load_or_create(storage: BaseStorage, name: str, directions: list[str]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=storage, study_name=name, directions=directions,
                               load_if_exists=True)


__all__ = ["GRACE_S", "HEARTBEAT_S", "FlockJournalLock", "HeartbeatJournalStorage",
           "SyncedJournalFile", "check_storage",
           "default_storage_url", "journal_path", "load_or_create", "open_storage", "redact",
           "retry_stale_job"]
