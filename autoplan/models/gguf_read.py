"""One parsed GGUF header per file per process, for header reads only.

Reasoning (parse cost, the cache key, why tensor data is read through readers of its own):
docs/modules.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from gguf import GGUFReader

# a model argument, its converted source and an export's source at most
_OPEN_FILES = 4

T = TypeVar("T")


def per_file(maxsize: int) -> Callable[[Callable[[Path], T]], Callable[[str | Path], T]]:
    """Cache ``fn(path)`` per file in this process until the file changes (its
    `file_identity`); ``cache_clear`` and ``cache_info`` are the cache's own."""
    def wrap(fn: Callable[[Path], T]) -> Callable[[str | Path], T]:
        @functools.lru_cache(maxsize=maxsize)
        def cached(resolved: str, *identity: int) -> T:
            del identity  # the cache key only: a rewritten file is read again
            return fn(Path(resolved))

        @functools.wraps(fn)
        def call(path: str | Path) -> T:
            resolved = Path(path).resolve()
            return cached(str(resolved), *file_identity(resolved))

        call.cache_clear, call.cache_info = cached.cache_clear, cached.cache_info  # type: ignore[attr-defined]
        return call
    return wrap


def file_identity(path: Path) -> tuple[int, int, int, int]:
    """What changes when a file is rewritten: inode, size, modification and change time."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@per_file(_OPEN_FILES)
def gguf_reader(path: Path) -> GGUFReader:
    """The parsed GGUF at ``path``, shared with every other caller in this process: read
    its fields and tensor records, not its tensors' data (module docstring).

    Raises:
        OSError: the file cannot be read; ValueError: it is not a GGUF (gguf-py's errors).
    """
    from gguf import GGUFReader

    return GGUFReader(str(path), "r")


__all__ = ["file_identity", "gguf_reader", "per_file"]
