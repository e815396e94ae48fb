"""`autoplan worker`: join a running search. Thin over autoplan.search.run_worker."""

from __future__ import annotations

import math

import click

from autoplan.cli._execution import execution_options, settings_from
from autoplan.cli._output import err_console
from autoplan.cli._progress import RichReporter


@click.command("worker")
@click.option("--storage", required=True,
              help="The search's Optuna storage URL (journal:PATH, postgresql://...).")
@click.option("--study", required=True, help="The search's study name (autoplan-...).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=120.0,
              show_default=True, help="Seconds to wait for the search to start, and to "
                                      "keep waiting once its driver is gone.")
@execution_options
@click.option("--quiet", is_flag=True, help="No progress output.")
def command(storage, study, wait_s, device, execution, offload_dir, quiet) -> None:  # noqa: ANN001
    """Take trial batches and candidate measurements of a running search until it is done."""
    from autoplan.errors import UserInputError
    from autoplan.search.storage_url import check_storage_early, check_worker_journal
    from autoplan.streaming.device import check_device_cheaply

    if math.isnan(wait_s):  # click's range lets NaN through; it would wait forever
        raise UserInputError("--wait must be a number of seconds >= 0, got nan")
    check_device_cheaply(device)  # the arguments first, before the search stack is imported
    # a journal that could not be written, or that no search created when not waiting; a
    # bad RDB URL, a missing driver, a database that refuses: run_worker checks them again
    check_storage_early(storage)
    check_worker_journal(storage, study, wait_s)
    from autoplan.search import run_worker

    with RichReporter(quiet=quiet) as reporter:
        report = run_worker(storage, study, settings_from(device, execution, offload_dir),
                            reporter, wait_s=wait_s)
    err_console.print(f"worker stopped ({report.reason}): {report.trials} trials in "
                      f"{report.batches} batches, {report.verified} candidates measured")
