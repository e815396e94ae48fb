"""`autoplan report`: a self-contained HTML report (matplotlib plots embedded) of a plan or
of a compare folder."""

from autoplan.report.build import render_report, write_report

__all__ = ["render_report", "write_report"]
