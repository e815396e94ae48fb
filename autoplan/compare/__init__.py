"""`autoplan compare`: plans for one model and budget on several targets and runtimes, one
sensitivity profile and shared verifications, one table sorted by the objective."""

from autoplan.compare.request import CompareEntry, CompareRequest, parse_entries
from autoplan.compare.run import RESULT_FILE, Comparison, Row, run_compare

__all__ = ["RESULT_FILE", "CompareEntry", "CompareRequest", "Comparison", "Row", "parse_entries",
           "run_compare"]
