"""The processes that run the stages: `run_search` drives a search and writes its plan;
`run_worker` joins one through its storage, rebuilding the driver's inputs from the record
the driver leaves in the job queue.
"""

from __future__ import annotations

from autoplan.search.run._record import (
    RECORD_VERSION,
    check_same_inputs,
    request_from_record,
    request_record,
)
from autoplan.search.run._search import SearchOutcome, run_search
from autoplan.search.run._worker import WorkerReport, run_worker

__all__ = [
    "RECORD_VERSION",
    "SearchOutcome",
    "WorkerReport",
    "check_same_inputs",
    "request_from_record",
    "request_record",
    "run_search",
    "run_worker",
]
