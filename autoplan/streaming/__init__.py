"""Where and how the expensive work runs: on `--device`, in memory or streamed one decoder
block at a time from the memory-mapped checkpoint (`--execution auto|memory|stream`)."""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py)
_EXPORTS = {
    "ExecutionSettings": "autoplan.streaming.settings",
    "ModelRunner": "autoplan.streaming.runner",
    "open_model": "autoplan.streaming.runner",
    "resolve_device": "autoplan.streaming.device",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

__all__ = ["ExecutionSettings", "ModelRunner", "open_model", "resolve_device"]
