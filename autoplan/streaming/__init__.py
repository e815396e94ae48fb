"""Where and how the expensive work runs: on `--device`, in memory or streamed one decoder
block at a time from the memory-mapped checkpoint (`--execution auto|memory|stream`)."""

from autoplan.streaming.device import resolve_device
from autoplan.streaming.runner import ExecutionSettings, ModelRunner, open_model

__all__ = ["ExecutionSettings", "ModelRunner", "open_model", "resolve_device"]
