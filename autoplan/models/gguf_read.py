"""One parsed GGUF header per file per process, for header reads only.

Reasoning (parse cost, the cache key, why tensor data is read through readers of its own):
docs/modules.md.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gguf import GGUFReader

# a model argument, its converted source and an export's source at most
_OPEN_FILES = 4


@functools.lru_cache(maxsize=_OPEN_FILES)
def _reader(path: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> GGUFReader:
    del inode, size, mtime_ns, ctime_ns  # the cache key only
    from gguf import GGUFReader

    return GGUFReader(path, "r")


def gguf_reader(path: str | Path) -> GGUFReader:
    """The parsed GGUF at ``path``, shared with every other caller in this process: read
    its fields and tensor records, not its tensors' data (module docstring).

    Raises:
        OSError: the file cannot be read; ValueError: it is not a GGUF (gguf-py's errors).
    """
    resolved = Path(path).resolve()
    return _reader(str(resolved), *file_identity(resolved))


def file_identity(path: Path) -> tuple[int, int, int, int]:
    """What changes when a file is rewritten: inode, size, modification and change time."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


__all__ = ["file_identity", "gguf_reader"]
