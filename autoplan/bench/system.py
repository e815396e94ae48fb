"""Process memory and machine bandwidth, measured with the standard library and torch."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path


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


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache of this machine (Linux sysfs), None where it is not known."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (ValueError, IndexError):
            continue
    return max(sizes) if sizes else None


def probe_bytes(cache_bytes: int | None) -> int:
    """read_bandwidth's buffer: 8x the last-level cache (every read misses it), within
    64-512 MiB; 512 MiB when the cache is not known. It is resident while bench measures,
    on top of the model (32 MiB L3: 256 MiB, not 512)."""
    if cache_bytes is None:
        return 512 << 20
    return int(min(512 << 20, max(64 << 20, 8 * cache_bytes)))


def read_bandwidth(size_bytes: int | None = None, repeats: int = 3, threads: int | None = None
                   ) -> float:
    """Best-of-`repeats` memory read bandwidth in bytes/s: torch sum over a buffer far larger
    than the last-level cache (`size_bytes`, default ``probe_bytes``), on the same thread
    count the runtimes use."""
    import torch

    if size_bytes is None:
        size_bytes = probe_bytes(last_level_cache_bytes())

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


__all__ = ["current_rss_bytes", "last_level_cache_bytes", "peak_rss_bytes", "probe_bytes",
           "read_bandwidth"]
