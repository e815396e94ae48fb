"""`--execution` and `--device` as settings (no torch: the CLI reads them before any work)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autoplan.errors import UserInputError
from autoplan.textenum import TextEnum


class Execution(TextEnum):
    """How the expensive work runs: the whole model in memory, streamed one block at a time
    from the checkpoint, or auto (by the memory estimate)."""

    __noun__ = "--execution"

    AUTO = "auto"
    MEMORY = "memory"
    STREAM = "stream"


@dataclass(frozen=True)
class ExecutionSettings:
    """Where and how the expensive work runs on this machine (`--device`, `--execution`,
    `--offload-dir`, `--threads`): never what is searched, so none of it names a study."""

    device: str = "auto"
    execution: Execution | str = Execution.AUTO
    offload_dir: Path | None = None
    threads: int | None = None  # engine threads the measured kernels are timed with

    def __post_init__(self) -> None:
        object.__setattr__(self, "execution", Execution.parse(self.execution))
        if self.threads is not None and self.threads < 1:
            raise UserInputError(f"--threads must be a positive integer, got {self.threads}")


__all__ = ["Execution", "ExecutionSettings"]
