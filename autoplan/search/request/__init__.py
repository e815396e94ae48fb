"""What a search takes and what is refused before any work: `SearchRequest` (checked when it
is built) and `preflight` (stage 0: the platform resolved, everything checkable without
loading the model checked)."""

from __future__ import annotations

from autoplan.search.request._preflight import (
    ONNX_RUNTIME,
    Platform,
    UnfitBaseline,
    check_model,
    fits_reference,
    in_memory_only,
    kernel_timer,
    kv_options,
    measures_kernels,
    operating_point,
    preflight,
)
from autoplan.search.request._request import (
    KV_AUTO,
    MAX_SEED,
    CostTable,
    ExecutionSettings,
    SearchRequest,
    at_least,
    parse_choices,
    parse_kv_cache,
)

__all__ = [
    "KV_AUTO",
    "MAX_SEED",
    "ONNX_RUNTIME",
    "CostTable",
    "ExecutionSettings",
    "Platform",
    "UnfitBaseline",
    "SearchRequest",
    "at_least",
    "check_model",
    "fits_reference",
    "in_memory_only",
    "kernel_timer",
    "kv_options",
    "measures_kernels",
    "operating_point",
    "parse_choices",
    "parse_kv_cache",
    "preflight",
]
