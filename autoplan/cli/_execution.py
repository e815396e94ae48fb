"""`--device`, `--execution` and `--offload-dir`, shared by the commands that run a model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from autoplan.streaming.settings import Execution, ExecutionSettings


def execution_options(fn: Callable) -> Callable:
    """Add the three options; the command receives them as `device`, `execution`,
    `offload_dir` and builds an ExecutionSettings with `settings_from`."""
    fn = click.option("--offload-dir", type=click.Path(file_okay=False, path_type=Path),
                      default=None, help="Keep streamed block-boundary states in files here "
                      "instead of host RAM.")(fn)
    fn = click.option("--execution", type=click.Choice(Execution.values()),
                      default=Execution.AUTO.value,
                      show_default=True, help="memory: whole model at once; stream: one "
                      "decoder block at a time from the checkpoint; auto: by the memory "
                      "estimate (profile --dry-run prints it).")(fn)
    return click.option("--device", default="auto", show_default=True,
                        help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one).")(fn)


def settings_from(device: str, execution: str, offload_dir: Path | None,
                  threads: int | None = None) -> ExecutionSettings:
    return ExecutionSettings(device=device, execution=execution, offload_dir=offload_dir,
                             threads=threads)


__all__ = ["execution_options", "settings_from"]
