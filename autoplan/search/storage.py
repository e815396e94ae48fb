"""Optuna storage for a search: a file beside the plan by default, or any Optuna URL.

Trials are sampled on an in-memory study and each COMPLETED trial is copied to the
persistent storage at once (`add_trial`), so an interruption loses at most the trial in
flight, and re-running the same command reloads every finished trial and continues.

Default: an Optuna journal file (`<plan>.optuna.journal`). SQLite (`sqlite:///file.db`) and
any RDB URL (PostgreSQL for many workers) are accepted. Persisting one 120-parameter trial
costs about 17x more in SQLite than in the journal file on the 2-core reference machine
(benchmarks/storage_speed.py, docs/benchmarks.md), which decides whether 2,000 trials fit
in the search's time goal.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from autoplan.errors import UserInputError

_JOURNAL_PREFIX = "journal:"


def default_storage_url(plan_path: str | Path) -> str:
    p = Path(plan_path)
    return f"{_JOURNAL_PREFIX}{p.with_name(p.stem + '.optuna.journal')}"


def open_storage(url: str) -> BaseStorage:
    """`journal:PATH` (or a path ending in .journal) -> journal file; else an RDB URL."""
    if url.startswith(_JOURNAL_PREFIX) or url.endswith(".journal"):
        path = Path(url.removeprefix(_JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if "://" not in url:
        raise UserInputError(
            f"cannot read storage '{redact(url)}': use journal:PATH, sqlite:///PATH or an "
            "Optuna RDB URL such as postgresql://user@host/db"
        )
    try:
        return RDBStorage(url)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises many types; message is enough
        raise UserInputError(f"cannot open storage {redact(url)}: {type(exc).__name__}") from None


def redact(url: str) -> str:
    """The URL with any password replaced by ***, safe to print and to write into a plan."""
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unparsable: redact the whole userinfo part
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}" if "@" in rest else url


def load_or_create(storage: BaseStorage, name: str, directions: list[str]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=storage, study_name=name, directions=directions,
                               load_if_exists=True)


__all__ = ["default_storage_url", "load_or_create", "open_storage", "redact"]
