"""The distributed job queue: the Optuna storage a search keeps its trials in, and the queue of
jobs (trial batches, measurements, the driver's hold) that `autoplan search` and `autoplan
worker` processes claim from it.

    open_storage(url) -> BaseStorage          journal file, SQLite or any RDB URL
    JobQueue(storage, study) -> post / claim / finish jobs
"""

from __future__ import annotations

from autoplan.search.jobs._queue import (
    BATCH,
    POLL_S,
    Job,
    JobQueue,
    drain,
    picks_key,
    process_alive,
    queue_name,
    worker_id,
)
from autoplan.search.jobs._storage import (
    GRACE_S,
    HEARTBEAT_S,
    FlockJournalLock,
    HeartbeatJournalStorage,
    SyncedJournalFile,
    check_storage,
    default_storage_url,
    journal_path,
    load_or_create,
    open_storage,
    redact,
    retry_stale_job,
)

__all__ = [
    "BATCH",
    "FlockJournalLock",
    "GRACE_S",
    "HEARTBEAT_S",
    "HeartbeatJournalStorage",
    "Job",
    "JobQueue",
    "POLL_S",
    "SyncedJournalFile",
    "check_storage",
    "default_storage_url",
    "drain",
    "journal_path",
    "load_or_create",
    "open_storage",
    "picks_key",
    "process_alive",
    "queue_name",
    "redact",
    "retry_stale_job",
    "worker_id",
]
