"""Can a file be written at a path? Checked before any work, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

from autoplan.atomic import creation_refused
from autoplan.errors import UserInputError


def check_writable_file(path: str | Path, what: str, fix: str) -> Path:
    """Refuse (one line naming ``fix``) a file path that could not be written later.

    The path must not be a folder, and its nearest existing ancestor must be a folder this
    process can create entries in (tried: a probe file, or a probe folder where folders in
    between are missing, removed at once). Missing folders in between are fine: the
    writers create them.

    Returns:
        The path, with ``~`` expanded.
    """
    p = Path(path).expanduser()
    folder = next((q for q in (p.parent, *p.parent.parents) if q.exists()), None)
    if p.is_dir():
        reason = "it is a folder"
    elif folder is None or not folder.is_dir():
        reason = f"'{folder}' is not a folder" if folder else "no folder above it exists"
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = f"'{folder}' is not writable"
    else:
        reason = creation_refused(folder, need_folder=folder != p.parent)
        if reason is None:
            return p
    raise UserInputError(f"cannot write the {what} {p} ({reason}): {fix}")


JOURNAL_PREFIX = "journal:"


def journal_path(url: str) -> Path | None:
    """The journal file a storage URL names (`journal:PATH`, or a path ending `.journal`),
    or None for an RDB URL."""
    if url.startswith(JOURNAL_PREFIX) or url.endswith(".journal"):
        return Path(url.removeprefix(JOURNAL_PREFIX))
    return None


def check_journal(url: str) -> bool:
    """For a journal URL, refuse a file that could not be written (nothing is created, so a
    search refused later leaves no empty journal behind); False for an RDB URL. No Optuna:
    the CLI asks before importing the search stack."""
    path = journal_path(url)
    if path is None:
        return False
    check_writable_file(path, "study journal",
                        "pass a writable --storage journal:PATH (or --out in a writable folder)")
    return True


__all__ = ["JOURNAL_PREFIX", "check_journal", "check_writable_file", "journal_path"]
