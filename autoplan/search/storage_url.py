"""A storage URL read and checked without Optuna or torch: its dialect and driver, its
password redacted, a database that cannot be opened, a worker's journal no search created.

The CLI asks here before importing the search stack (seconds); `jobs` opens the storage
later with the same checks and messages (SQLAlchemy alone parses a URL: a fraction of a
second).
"""

from __future__ import annotations

import re
from pathlib import Path

from autoplan.errors import UserInputError
from autoplan.search.writable import check_journal, journal_path

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


def check_rdb_driver(url: str) -> None:
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


# sqlite:///PATH (relative) or sqlite:////PATH (absolute) through Python's own sqlite3, with no
# query and nothing %-quoted: SQLAlchemy reads PATH as it stands
_PLAIN_SQLITE = re.compile(r"sqlite(?:\+pysqlite)?:///([\w./-]+)")


def check_storage_early(url: str) -> None:
    """What `jobs.check_storage` refuses, short of opening the storage through Optuna
    (which creates a new SQLite file and Optuna's tables, so it waits for preflight's
    other checks): a journal that could not be written; an RDB URL that does not parse,
    names an unknown dialect or a missing driver; an SQLite file in no folder; a database
    server that refuses a connection (opened and closed at once, nothing written).

    Raises:
        UserInputError: one line naming the fix, never the password.
    """
    if check_journal(url):
        return
    plain = _PLAIN_SQLITE.fullmatch(url)  # a file path, no options: no SQLAlchemy needed
    shown = url if plain is not None else redact(url)  # such a URL holds no password
    if plain is None:
        check_rdb_driver(url)
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    try:
        if plain is not None or parsed.get_backend_name() == "sqlite":
            path = Path(plain.group(1) if plain is not None else parsed.database or "")
            if str(path) not in ("", ".", ":memory:") and not path.exists() \
                    and not path.parent.is_dir():
                import sqlite3  # SQLite's own error; it creates nothing where no folder is

                sqlite3.connect(str(path)).close()
            return
        from sqlalchemy import create_engine

        engine = create_engine(parsed)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - drivers raise many types
        raise UserInputError(f"cannot open storage {shown}: "
                             f"{storage_error(exc, url)}") from None


def storage_error(exc: BaseException, url: str) -> str:
    """The first line of a database error, with the URL's password scrubbed from it."""
    orig = getattr(exc, "orig", None) or exc
    line = (str(orig).strip().splitlines() or [""])[0][:200]
    secret = _password(url)
    if secret:
        line = line.replace(secret, "***")
    return f"{type(orig).__name__}: {line}" if line else type(orig).__name__


def _password(url: str) -> str | None:
    if "@" not in url:  # no user-info part: no password (and no SQLAlchemy to import)
        return None
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


def no_search(study: str, label: str, wait_s: float) -> UserInputError:
    """A worker's refusal when no search named `study` appeared in `label` within
    `wait_s` seconds."""
    return UserInputError(f"no search named {study} in {label} after {wait_s:g} s: "
                          f"start `autoplan search --storage URL --study {study}` (the "
                          "study name its plan and progress show), then the worker")


def check_worker_journal(url: str, study: str, wait_s: float) -> None:
    """A worker told not to wait (`--wait 0`) for a journal file that does not exist: no
    search has started there, so the answer is known without opening anything."""
    path = journal_path(url)
    if path is not None and wait_s == 0 and not path.is_file():
        raise no_search(study, redact(url), wait_s)


__all__ = ["check_rdb_driver", "check_storage_early", "check_worker_journal", "no_search",
           "redact", "storage_error"]
