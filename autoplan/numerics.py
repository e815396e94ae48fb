"""The torch thread count the SparseGPT/GPTQ solvers run on, pinned per plan.

Their Cholesky factorization of the inverse Hessian (LAPACK, multi-threaded) rounds
differently for each thread count: measured on the embedded model, a 2:4 SparseGPT layer
solved on 1 and on 2 threads differs in its mask and weights, while the same count always
gives the same bits. A plan's audit is a sha256 of those bits, so a plan searched on one
count could not be exported or recovered on a machine (or shell) with another. The search
records its count (`CompressionSettings.solver_threads`, the plan's ``audit``) and every
later recomputation pins torch to it for the solver alone; the forward passes keep
whatever threads the process has.

The bits also depend on the torch build and the CPU's vector kernels (AVX2 vs AVX-512):
``signature()`` is recorded beside the count, so a refusal can name what differs.
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
