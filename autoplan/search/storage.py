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

import re
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from autoplan.errors import UserInputError
from autoplan.search.writable import check_writable_file

_JOURNAL_PREFIX = "journal:"


def default_storage_url(plan_path: str | Path) -> str:
    p = Path(plan_path)
    return f"{_JOURNAL_PREFIX}{p.with_name(p.stem + '.optuna.journal')}"


_DRIVER_INSTALL = {  # DB-API module SQLAlchemy imports -> what to install
    "psycopg": 'pip install "autoplan[postgres]" (psycopg 3, the driver SQLAlchemy uses for '
               "postgresql://)",
    "psycopg2": "pip install psycopg2-binary, or use postgresql+psycopg:// with "
                'pip install "autoplan[postgres]"',
    "MySQLdb": "pip install mysqlclient, or use mysql+pymysql:// with pip install pymysql",
    "pymysql": "pip install pymysql",
}
# key=value pairs in a URL's query that carry a secret (libpq accepts password=...).
_SECRET_QUERY = re.compile(r"(?i)([?&](?:password|passwd|pwd|pass|secret|token|sslpassword)=)"
                           r"[^&]*")


def _is_journal(url: str) -> bool:
    return url.startswith(_JOURNAL_PREFIX) or url.endswith(".journal")


def check_storage(url: str) -> None:
    """Validate a storage URL and reach its database, before any search work is done.

    A journal file: its folder must exist or be creatable and be writable (nothing is
    created, so a search refused later leaves no empty journal behind). An RDB URL: the
    dialect must be known, its driver importable, and the database reachable (opened once
    through Optuna, which also checks its schema version). Every message is one line and
    never holds the password.

    Raises:
        UserInputError: the URL is malformed, names an unknown database, its driver is not
            installed (the message names the package), or the database cannot be opened.
    """
    if _is_journal(url):
        check_writable_file(url.removeprefix(_JOURNAL_PREFIX), "study journal",
                            "pass a writable --storage journal:PATH (or --out in a writable "
                            "folder)")
        return
    _rdb_driver(url)
    open_storage(url)


def _rdb_driver(url: str) -> None:
    """Refuse an RDB URL whose dialect is unknown or whose driver is not installed."""
    if "://" not in url:
        raise UserInputError(
            f"cannot read storage '{redact(url)}': use journal:PATH, sqlite:///PATH or an "
            "Optuna RDB URL such as postgresql://user@host/db")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        dialect = make_url(url).get_dialect()
    except (ArgumentError, ValueError) as exc:
        raise UserInputError(f"cannot read storage '{redact(url)}' ({type(exc).__name__}): "
                             "check the URL, e.g. postgresql://user:PASSWORD@host:5432/db "
                             "(quote special characters in the password as %XX)") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        module = (exc.name or "").split(".")[0]
        fix = _DRIVER_INSTALL.get(module, f"pip install {module}" if module else
                                  "install the database driver")
        raise UserInputError(f"storage {redact(url)} needs the Python module '{module}', "
                             f"which is not installed: {fix}") from None


def open_storage(url: str) -> BaseStorage:
    """`journal:PATH` (or a path ending in .journal) -> journal file; else an RDB URL."""
    if _is_journal(url):
        path = Path(url.removeprefix(_JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    _rdb_driver(url)
    try:
        return RDBStorage(url)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises many types; message is enough
        raise UserInputError(f"cannot open storage {redact(url)}: {_reason(exc, url)}") from None


def _reason(exc: BaseException, url: str) -> str:
    """The first line of a database error, with the URL's password scrubbed from it."""
    orig = getattr(exc, "orig", None) or exc
    line = (str(orig).strip().splitlines() or [""])[0][:200]
    secret = _password(url)
    if secret:
        line = line.replace(secret, "***")
    return f"{type(orig).__name__}: {line}" if line else type(orig).__name__


def _password(url: str) -> str | None:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).password
    except Exception:  # noqa: BLE001 - unparsable: take everything between :// and the last @
        rest = url.split("://", 1)[-1]
        return rest.rsplit("@", 1)[0] if "@" in rest else None


def redact(url: str) -> str:
    """The URL with any password replaced by ***, safe to print and to write into a plan.

    A URL SQLAlchemy cannot parse loses its whole user-info part (everything between
    ``://`` and the LAST ``@``: an unquoted ``@`` in a password splits it anywhere; without
    an ``@``, the whole authority), and a password given as a query parameter is masked
    either way.
    """
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        out = make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unparsable: redact the whole userinfo part
        scheme, rest = url.split("://", 1)
        if "@" in rest:
            out = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        else:  # no telling user:password from host:port: hide the whole authority
            out = f"{scheme}://***" + (f"/{rest.split('/', 1)[1]}" if "/" in rest else "")
    return _SECRET_QUERY.sub(r"\1***", out)


def load_or_create(storage: BaseStorage, name: str, directions: list[str]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=storage, study_name=name, directions=directions,
                               load_if_exists=True)


__all__ = ["check_storage", "default_storage_url", "load_or_create", "open_storage", "redact"]
