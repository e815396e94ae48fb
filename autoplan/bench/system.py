"""Process memory and machine bandwidth, measured with the standard library and torch."""

from __future__ import annotations

import os
import resource
import sys
import time


def current_rss_bytes() -> int:
    """Resident set size now (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def read_bandwidth(size_bytes: int = 512 << 20, repeats: int = 3, threads: int | None = None
                   ) -> float:
    """Best-of-`repeats` memory read bandwidth in bytes/s: torch sum over a buffer far larger
    than the last-level cache, on the same thread count the runtimes use."""
    import torch

    from autoplan.backends.cpu.ort_runtime import physical_cores

    old = torch.get_num_threads()
    torch.set_num_threads(threads or physical_cores())
    try:
        buf = torch.ones(size_bytes // 4, dtype=torch.float32)
        buf.sum()  # touch every page before timing
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            buf.sum()
            best = min(best, time.perf_counter() - t0)
        return size_bytes / best
    finally:
        torch.set_num_threads(old)


__all__ = ["current_rss_bytes", "peak_rss_bytes", "read_bandwidth"]
