"""The torch thread count the SparseGPT/GPTQ solvers run on, pinned per plan.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def current_threads() -> int:
    return torch.get_num_threads()


def signature() -> str:
    """What besides the thread count fixes the solvers' rounding: torch build and CPU kernels."""
    return f"torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}"


@contextmanager
def pinned_threads(threads: int | None) -> Iterator[None]:
    """Run the block on ``threads`` torch threads (None: as the process is), then restore."""
    if threads is None or threads == torch.get_num_threads():
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


__all__ = ["current_threads", "pinned_threads", "signature"]
