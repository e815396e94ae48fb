"""Give large freed buffers back to the operating system during streamed runs (glibc).

A streamed run allocates and frees the same few sizes over and over: a block's fp32 weights,
its captures, a layer's Hessian, all 1-200 MB. glibc serves allocations above its mmap
threshold from fresh mappings, but that threshold is dynamic: each mapping freed raises it
to the freed size (up to 32 MiB on 64-bit), after which buffers of a few MiB to 32 MiB come
from the heap, where what is freed is kept and fragments instead of going back. Measured on
a 4-block TinyLlama-shaped profile (benchmarks/scale.py's shape, docs/benchmarks.md): peak
RSS 1.56 GiB with glibc's defaults, 1.32 GiB with the threshold fixed at 1 MiB. Fixing it
(which also stops the dynamic adjustment) keeps the peak near what the run really holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 20  # 1 MiB: a row of a 4096-wide fp32 activation is 16 KiB, a block 100s of MB


def return_large_frees_to_os(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap and trim thresholds at `threshold` bytes for this process.

    Returns:
        Whether it was applied (False off Linux/glibc, where the allocator differs).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(M_TRIM_THRESHOLD, threshold))


__all__ = ["return_large_frees_to_os"]
