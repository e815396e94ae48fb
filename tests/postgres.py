"""A throwaway PostgreSQL server for tests and benchmarks, from Debian's `postgresql` package.

`initdb` into a fresh temporary folder, `pg_ctl start` listening on 127.0.0.1 only, at a
free port, with its unix socket in that folder; trust authentication for one role, so the
URL holds no password. Stopped and removed on exit. PostgreSQL refuses to run as root, so
under root (CI) the server runs as the `postgres` account the package creates.

    with PostgresServer() as pg:
        url = pg.url  # postgresql+psycopg://autoplan@127.0.0.1:PORT/postgres
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

ROLE = "autoplan"


def postgres_bin() -> Path | None:
    """The folder with initdb and pg_ctl: Debian keeps them off PATH, per major version."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def why_not_available() -> str | None:
    """None when a server can be started here; otherwise the reason (for pytest.skip)."""
    if postgres_bin() is None:
        return "PostgreSQL binaries not found: apt-get install -y postgresql (.ci/run does)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return 'psycopg is not installed: pip install "autoplan[postgres]"'
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' account to run the server"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """Start on enter, stop and delete on exit. `durable=False` turns fsync off (tests:
    nothing here survives a power cut anyway); benchmarks keep PostgreSQL's defaults."""

    def __init__(self, *, durable: bool = True, max_connections: int = 100) -> None:
        self.durable, self.max_connections = durable, max_connections
        self.folder: Path | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(postgres_bin() / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       cwd="/")

    def __enter__(self) -> PostgresServer:
        reason = why_not_available()
        if reason:
            raise RuntimeError(reason)
        self.folder = Path(tempfile.mkdtemp(prefix="autoplan-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        data = self.folder / "data"
        self._run("initdb", "-D", str(data), "-U", ROLE, "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        self.port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} "
                   f"-c max_connections={self.max_connections}"
                   + ("" if self.durable else " -c fsync=off -c synchronous_commit=off"))
        try:
            self._run("pg_ctl", "-D", str(data), "-o", options, "-l",
                      str(self.folder / "server.log"), "-w", "-t", "60", "start")
        except subprocess.CalledProcessError as exc:
            log = (self.folder / "server.log")
            detail = log.read_text()[-2000:] if log.exists() else exc.stderr.decode()[-2000:]
            self._remove()
            raise RuntimeError(f"PostgreSQL did not start: {detail}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            try:
                self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w",
                          "stop")
            except subprocess.CalledProcessError:
                pass
            self._remove()

    def _remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
