"""Models from the local Hugging Face cache, found offline, never downloaded.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from autoplan.errors import UserInputError

# ORG/NAME with an optional @REVISION: the shape of a hub repo id, checked before any lookup
# so that a mistyped local path is not reported as a missing hub model.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


class NotInHubCacheError(UserInputError):
    """A repo id that is not in the local Hugging Face cache (autoplan never downloads)."""


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, from the environment as it is now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def parse_repo_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``text`` has the shape ``ORG/NAME[@REV]``, else None."""
    match = _REPO_ID.match(text.strip())
    if not match or ".." in match["repo"]:
        return None
    return match["repo"], match["rev"]


def hub_snapshot(text: str) -> Path:
    """The cached snapshot folder of ``ORG/NAME[@REV]`` (revision ``main`` by default).

    Args:
        text: a repo id as users type it, optionally with ``@REVISION`` (a branch, tag or
            commit hash that was downloaded).

    Returns:
        ``<cache>/models--ORG--NAME/snapshots/<commit>/``, holding at least config.json.

    Raises:
        UserInputError: ``text`` is not a repo id.
        NotInHubCacheError: the repo or revision is not cached, or its snapshot has no
            config.json; the message names the folder looked in and the download command.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    parsed = parse_repo_id(text)
    if parsed is None:
        raise UserInputError(f"'{text}' is not a Hugging Face repo id (ORG/NAME)")
    repo_id, revision = parsed
    cache = hub_cache_dir()
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    fetch = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    try:
        snapshot = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                          local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        rev = f" at revision {revision}" if revision else ""
        raise NotInHubCacheError(
            f"'{text}' is neither a local folder nor in the Hugging Face cache{rev} (looked "
            f"in {folder}; set HF_HUB_CACHE or HF_HOME if it is elsewhere); autoplan never "
            f"downloads: run `{fetch}` first") from None
    if not (snapshot / "config.json").is_file():
        raise NotInHubCacheError(f"the cached snapshot {snapshot} of '{repo_id}' has no "
                                 f"config.json (an interrupted download?): run `{fetch}`")
    return snapshot


__all__ = ["NotInHubCacheError", "hub_cache_dir", "hub_snapshot", "parse_repo_id"]
