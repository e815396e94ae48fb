"""glibc's heap policy for this process: give large frees back, or keep them for reuse.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Iterator

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 20  # 1 MiB: a row of a 4096-wide fp32 activation is 16 KiB, a block 100s of MB
KEEP_MMAP_THRESHOLD = 1 << 30  # 1 GiB: only buffers larger than this are mapped and unmapped
KEEP_TRIM_THRESHOLD = 2**31 - 1  # ~2 GiB of free heap top before glibc trims: mallopt's int max

_fixed: tuple[int, int] | None = None  # the thresholds this module last set (None: glibc's)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):  # musl and others have no mallopt / malloc_trim
        return None
    return libc


def _set(mmap_threshold: int, trim_threshold: int) -> bool:
    global _fixed
    libc = _libc()
    if libc is None:
        return False
    done = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))
    if done:
        _fixed = (mmap_threshold, trim_threshold)
    return done


def return_large_frees_to_os(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap and trim thresholds at ``threshold`` bytes for this process.

    Returns:
        Whether it was applied (False off Linux/glibc, where the allocator differs).
    """
    return _set(threshold, threshold)


def keep_frees_for_reuse() -> bool:
    """Keep freed buffers up to 1 GiB (and up to 2 GiB of free heap top) for the next
    allocation: what a training loop wants.

    Returns:
        Whether it was applied (False off Linux/glibc).
    """
    return _set(KEEP_MMAP_THRESHOLD, KEEP_TRIM_THRESHOLD)


def release_kept_memory() -> bool:
    """Hand the heap's free memory back to the OS now (``malloc_trim(0)``).

    Returns:
        Whether glibc released any memory (False off Linux/glibc).
    """
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))


@contextlib.contextmanager
def frees_kept_for_reuse() -> Iterator[bool]:
    """``keep_frees_for_reuse`` for the ``with`` block; afterwards the heap is trimmed and a
    policy fixed before (a streamed run's) is fixed again. glibc's dynamic thresholds cannot
    be restored once fixed, so a process that had none keeps the reuse thresholds (later
    torch work in it is faster for it) with its free memory handed back.

    Yields:
        Whether the policy applies (False off Linux/glibc).
    """
    before = _fixed
    applied = keep_frees_for_reuse()
    try:
        yield applied
    finally:
        if applied:
            if before is not None:
                _set(*before)
            release_kept_memory()


__all__ = ["frees_kept_for_reuse", "keep_frees_for_reuse", "release_kept_memory",
           "return_large_frees_to_os"]
