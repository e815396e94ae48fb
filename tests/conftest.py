"""Shared fixtures. GPU tests are skipped cleanly with a printed reason when no GPU exists."""

from __future__ import annotations

import pytest

from autoplan.backends.registry import load_backends

# What the CLI does at start: register the backends and the targets they measure (`local`).
load_backends()


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - any import problem means no usable GPU
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU; none found (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
