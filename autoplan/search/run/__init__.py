"""What runs the stages: `Pipeline` (one model, one or more platforms: `autoplan search`
and `autoplan compare` both run it), `run_search` (the pipeline on one platform) and
`run_worker` (joins a running search through its storage, rebuilding the driver's inputs
from the record the driver leaves in the job queue).
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py): a worker waits for its
# search before importing the stack
_EXPORTS = {
    "Pipeline": "autoplan.search.run._pipeline",
    "Searched": "autoplan.search.run._pipeline",
    "Skipped": "autoplan.search.run._pipeline",
    "RECORD_VERSION": "autoplan.search.run._record",
    "check_same_inputs": "autoplan.search.run._record",
    "request_from_record": "autoplan.search.run._record",
    "request_record": "autoplan.search.run._record",
    "SearchOutcome": "autoplan.search.run._search",
    "run_search": "autoplan.search.run._search",
    "WorkerReport": "autoplan.search.run._worker",
    "run_worker": "autoplan.search.run._worker",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

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
