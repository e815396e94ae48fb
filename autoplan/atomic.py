"""Atomic writes: the one place autoplan writes files and folders that others may read.

Every writer goes through a temporary sibling (same filesystem) and one ``os.replace`` or
``rename``, so a reader -- a server loading an export, a worker reading a cache, a user
reading a plan -- sees the old file or the complete new one, never a part. A failure or a
kill leaves the old content in place and removes the temporary sibling.

This module imports only the standard library and ``autoplan.errors``: every layer may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from autoplan.errors import AutoplanError, UserInputError


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting it to
    read it back would briefly affect files other threads create)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_created(path: str | os.PathLike[str], *, folder: bool) -> None:
    """Give a temp file / folder the mode a plain ``open`` / ``mkdir`` would have: tempfile
    makes them 0600 / 0700, which would keep a server running as another user from reading
    an export or a plan once it is renamed into place."""
    os.chmod(path, (0o777 if folder else 0o666) & ~_umask())


def write_text_atomic(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> Path:
    """Write ``text`` to ``path`` through a temp sibling and ``os.replace``.

    Args:
        path: the file to write; its folder is created.
        text: the content.
        fsync: flush to disk before the rename (plans, caches that must survive a crash).
    """
    return write_bytes_atomic(path, text.encode(), fsync=fsync)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *,
                       fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temp sibling and ``os.replace`` (see
    ``write_text_atomic``)."""
    return write_parts_atomic(path, [data], fsync=fsync)


def write_parts_atomic(path: str | os.PathLike[str], parts: Iterable[Any], *,
                       fsync: bool = True) -> Path:
    """``write_bytes_atomic`` of the concatenation of ``parts`` (bytes or any buffer, e.g. a
    numpy array's memoryview), written one after the other: a file of large tensors is
    never joined into one bytes object in memory first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        _as_created(tmp, folder=False)
        with os.fdopen(fd, "wb") as fh:
            for part in parts:
                fh.write(part)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def json_text(data: Any, indent: int | None = 2) -> str:
    """JSON with sorted keys and a final newline."""
    return json.dumps(data, indent=indent, sort_keys=True) + "\n"


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as sorted-key JSON atomically (see ``write_text_atomic``)."""
    return write_text_atomic(path, json_text(data, indent))


def replace_files(files: Mapping[Path, Path]) -> None:
    """Move finished temp files onto their destinations, in the mapping's order.

    Each move is atomic; callers order them so that the file a reader looks for first (the
    one that marks the set complete) goes last.
    """
    for src, dest in files.items():
        os.replace(src, dest)


def check_writable_dir(target: str | os.PathLike[str], flag: str = "--out") -> Path:
    """Refuse early (before any work) a destination autoplan could not create or replace.

    The destination itself may not exist yet; its nearest existing ancestor must be a
    folder that takes a new entry (tried: `creation_refused`), and the destination, when it
    exists, a folder or a plain file.

    Raises:
        UserInputError: one line naming the flag and the fix.
    """
    target = Path(target)
    if target.exists() and not (target.is_dir() or target.is_file()):
        raise UserInputError(f"{flag} '{target}' is neither a folder nor a file: pick another path")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserInputError(f"{flag} '{target}': '{parent}' is not a folder: pick another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserInputError(f"{flag} '{target}': folder '{parent}' is not writable: pick a "
                             "writable path")
    refused = creation_refused(parent, need_folder=parent != target.parent)
    if refused:
        raise UserInputError(f"{flag} '{target}': {refused}: pick a writable path")
    return target


def creation_refused(folder: Path, need_folder: bool) -> str | None:
    """Why `folder` does not take a new entry (a folder when `need_folder`), tried with a
    probe that is removed at once: os.access answers yes to root on read-only and virtual
    file systems (/proc), where a writer would fail only after the work was done."""
    try:
        if need_folder:
            os.rmdir(tempfile.mkdtemp(prefix=".autoplan-probe-", dir=folder))
        else:
            handle, probe = tempfile.mkstemp(prefix=".autoplan-probe-", dir=folder)
            os.close(handle)
            os.unlink(probe)
    except OSError as exc:
        what = "folder" if need_folder else "file"
        return f"'{folder}' does not take a new {what}: {exc.strerror or exc}"
    return None


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str], *, is_ours: Callable[[Path], bool],
               what: str = "autoplan export") -> Iterator[Path]:
    """Yield an empty temp folder that replaces ``target`` only if the block succeeds.

    A previous folder at ``target`` is replaced only when ``is_ours(target)`` says autoplan
    wrote it (or it is empty); it is moved aside under a fresh unique name, never a fixed
    one, so nothing autoplan did not create is ever deleted.

    Raises:
        UserInputError: ``target`` is a file, or a folder autoplan did not write.
        AutoplanError: the finished folder cannot be moved into place (the old one is kept).
    """
    target = Path(target)
    if target.exists() and (not target.is_dir()
                            or (any(target.iterdir()) and not is_ours(target))):
        raise UserInputError(f"'{target}' exists and is not an {what}: choose a new --out "
                             "folder or remove it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        _as_created(tmp, folder=True)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    try:
        if target.exists():
            # rename(2) may replace an empty folder: the unique name is ours alone.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old",
                                        dir=target.parent))
            target.rename(old)
        tmp.rename(target)
    except OSError as err:
        if old is not None and not target.exists():
            old.rename(target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise AutoplanError(f"cannot move the {what} into '{target}': {err}") from err
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_new_dir(dest: Path, *, complete: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a temp folder that becomes ``dest`` if the block finishes (content-addressed).

    For caches whose name carries a content hash: if another process finished ``dest``
    first (``complete(dest)``), ours is discarded, since both hold the same content.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        _as_created(tmp, folder=True)
        yield tmp
        try:
            tmp.rename(dest)
        except OSError:
            if not complete(dest):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["atomic_dir", "atomic_new_dir", "check_writable_dir", "creation_refused", "json_text",
           "replace_files", "write_bytes_atomic", "write_json_atomic", "write_parts_atomic",
           "write_text_atomic"]
