"""`--ray auto|ADDRESS`, shared by `profile` and `search`: the executor their work runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from autoplan.sensitivity.executor import Executor

ray_option = click.option(
    "--ray", "ray_address", default=None, metavar="auto|ADDRESS",
    help="Shard profile scoring and candidate verification over Ray workers (one GPU each "
         "when the cluster has GPUs): auto = the cluster in RAY_ADDRESS, else a local one on "
         "127.0.0.1; or HOST:PORT of a running cluster. Needs pip install 'autoplan[ray]'.")


@contextmanager
def executor_for(ray_address: str | None) -> Iterator[Executor]:
    """The serial executor, or a Ray one connected now (so a bad address fails before any
    model is loaded) and shut down on exit."""
    if ray_address is None:
        from autoplan.sensitivity.executor import SerialExecutor

        yield SerialExecutor()
        return
    from autoplan.sensitivity.ray_executor import RayExecutor

    ex = RayExecutor(ray_address)
    try:
        yield ex
    finally:
        ex.close()


__all__ = ["executor_for", "ray_option"]
