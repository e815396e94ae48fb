"""One parsed GGUF header per file per process, for header reads only, and `open_gguf`, the
one way autoplan opens a GGUF: a truncated or corrupt file is a one-line UserInputError.

Reasoning (parse cost, the cache key, why tensor data is read through readers of its own):
docs/modules.md.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from autoplan.errors import UserInputError

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
        OSError: the file cannot be read; UserInputError, CorruptGGUFError: as `open_gguf`.
    """
    return open_gguf(path)


class CorruptGGUFError(UserInputError, ValueError):
    """A file gguf-py cannot parse though it is not cut short (not a GGUF, another version,
    garbage in a record). Also a ValueError, what gguf-py raised before: a caller that skips
    an unreadable GGUF and leaves the refusal to transformers' reader (check_gguf_experts)
    still does."""


# What gguf-py's reader raises on a malformed file: names no enum member, another version,
# bad UTF-8 (ValueError), a repeated key (KeyError), a count numpy cannot take; IndexError
# and struct.error for short reads that `_checked_reader` did not catch first.
_MALFORMED = (ValueError, IndexError, KeyError, TypeError, struct.error, OverflowError)
_HEADER_BYTES = 24  # magic, version, tensor count, metadata count
# What transformers' own GGUF header parse (AutoConfig.from_pretrained(gguf_file=...)) raises
# on a file gguf-py read: it parses the header itself, so a file can still fail there.
TRANSFORMERS_GGUF_ERRORS = (ValueError, OSError, LookupError, TypeError, ArithmeticError,
                            struct.error)


def open_gguf(path: str | Path, mode: str = "r") -> GGUFReader:
    """A GGUFReader of its own for ``path`` (tensor data read through it stays mapped only
    as long as it lives); `gguf_reader` for a shared, header-only one.

    Raises:
        OSError: the file cannot be read. UserInputError: it is cut short (inside its header,
        metadata, tensor records or data), one line naming the file and the fix.
        CorruptGGUFError: it is not a GGUF gguf-py can parse, also one line.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:  # np.memmap refuses it with a message that names no fix
        raise _refusal(path, _Truncated(_HEADER_BYTES, 0))
    try:
        reader = _checked_reader()(str(path), mode)
    except _MALFORMED as exc:
        raise _refusal(path, exc) from None
    # the last tensor's end, in case a gguf-py whose reads differ from the ones
    # `_checked_reader` checks hands out short tensors without raising
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > len(reader.data):
        raise _refusal(path, _Truncated(end, len(reader.data)))
    return reader


class _Truncated(ValueError):
    """A read past the end of the file: at least ``end`` bytes needed, ``size`` there."""

    def __init__(self, end: int, size: int) -> None:
        super().__init__(f"{size} bytes, but it needs at least {end}")


def _refusal(path: Path, exc: Exception) -> UserInputError:
    """The one-line error for a GGUF gguf-py failed to read with ``exc``."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if not b"GGUF".startswith(magic):  # a file cut inside the magic is a truncated GGUF
        return CorruptGGUFError(f"cannot read GGUF '{path.name}': it is not a GGUF file (it "
                                "does not start with the GGUF magic bytes); pass a .gguf "
                                "model file or an HF folder")
    detail = (str(exc).splitlines() or [""])[0]
    if not isinstance(exc, _Truncated):
        detail = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    kind = UserInputError if isinstance(exc, _Truncated) else CorruptGGUFError
    return kind(f"cannot read GGUF '{path.name}': the file is truncated or corrupt "
                f"({detail}); download or convert it again")


@functools.cache
def _checked_reader() -> type[GGUFReader]:
    """GGUFReader whose reads past the end of the file raise `_Truncated`: gguf-py slices
    its memory map unchecked, so a short read fails later, if at all, as an IndexError or a
    reshape of the wrong size that do not say the file is cut short."""
    import numpy as np
    from gguf import GGUFReader

    class CheckedReader(GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):  # gguf-py's signature
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise _Truncated(end, len(self.data))
            return super()._get(offset, dtype, count, override_order)

    return CheckedReader


__all__ = ["TRANSFORMERS_GGUF_ERRORS", "CorruptGGUFError", "file_identity", "gguf_reader",
           "open_gguf", "per_file"]
