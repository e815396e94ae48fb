"""One parsed GGUF header per file per process.

`gguf.GGUFReader` parses every metadata field and tensor record when it opens a file: 2.7 s
for the embedded SmolLM2's GGUF (its 49,152-token vocabulary is most of it), and resolving a
GGUF model argument asks several questions of the same file (its architecture, its expert
counts, its fields, its tensor names and types). The reader is read-only (a read-only memory
map), so one per file is shared; a file rewritten in place or replaced gets a new one (the
key holds its inode, size, modification and change times: a copy that restores the
modification time still changes the change time).

For the header only: a cached reader keeps its memory map, so the pages of every tensor read
through it would stay in this process's resident set. Code that reads tensor data opens a
reader of its own (`gguf.GGUFReader`), dropped when it is done.
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
