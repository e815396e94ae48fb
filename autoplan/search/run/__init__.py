"""What runs the stages: `Pipeline` (one model, one or more platforms: `autoplan search`
and `autoplan compare` both run it), `run_search` (the pipeline on one platform) and
`run_worker` (joins a running search through its storage, rebuilding the driver's inputs
from the record the driver leaves in the job queue).
"""

from __future__ import annotations

from autoplan.search.run._pipeline import Pipeline, Searched, Skipped
from autoplan.search.run._record import (
    RECORD_VERSION,
    check_same_inputs,
    request_from_record,
    request_record,
)
from autoplan.search.run._search import SearchOutcome, run_search
from autoplan.search.run._worker import WorkerReport, run_worker

__all__ = [
    "Pipeline",
    "RECORD_VERSION",
    "SearchOutcome",
    "Searched",
    "Skipped",
    "WorkerReport",
    "check_same_inputs",
    "request_from_record",
    "request_record",
    "run_search",
    "run_worker",
]
