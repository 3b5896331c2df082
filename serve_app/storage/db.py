"""One SQLAlchemy engine per process for the accounts/usage database.

The gateway is usable with no setup (a SQLite file under the state folder) and
scales out on PostgreSQL; callers only see ``Database`` and plain Core
connections, so the same queries run on both.

SQLite needs help to behave like a server database: WAL lets readers run while
one writer writes, ``busy_timeout`` makes a second writer wait instead of
failing at once (``begin`` takes the write lock up front so that wait always
applies), and foreign keys are off unless asked for. Python's sqlite3
driver also opens transactions lazily and never around DDL, so the driver's own
transaction handling is switched off and SQLAlchemy's ``begin`` hook emits
``BEGIN`` itself (the recipe in SQLAlchemy's SQLite dialect documentation).
That is what lets the migration runner ask for ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from serve_app.settings import GatewaySettings, get_settings
from serve_app.storage.migrations import SQLITE_BEGIN_OPTION, run_migrations

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 15_000
_SQLITE_BEGIN_MODES = frozenset({"DEFERRED", "IMMEDIATE", "EXCLUSIVE"})


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy's begin hook owns BEGIN
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cursor)
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL, waiting out other connections doing the same.

    The journal mode is stored in the file, so this is a no-op after the first
    connection. Changing it needs an exclusive lock, and SQLite answers "database
    is locked" at once there instead of calling the busy handler, so connections
    opening a fresh file together (replicas starting, concurrent migrations)
    retry until ``busy_timeout`` is spent instead of failing.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()
            if mode and str(mode[0]).lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _on_sqlite_begin(conn: Connection) -> None:
    mode = str(conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED")).upper()
    if mode not in _SQLITE_BEGIN_MODES:
        raise ValueError(f"unknown SQLite BEGIN mode {mode!r}")
    conn.exec_driver_sql(f"BEGIN {mode}")


UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.DisconnectionError,
    sa.exc.TimeoutError,
)
"""What SQLAlchemy raises when the database is out of reach (down, restarting, refusing
connections, a dropped connection, a full pool), not when a statement or a value was
wrong: worth retrying later. The ledger keeps its records spooled on these; the error
mapper answers 503 (``serve_app.ingress.errors``)."""


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is one of ``UNREACHABLE_ERRORS``."""
    return isinstance(exc, UNREACHABLE_ERRORS)


def create_db_engine(url: str) -> Engine:
    """An engine with ``pool_pre_ping`` (a restarted server must not break replicas)."""
    engine = sa.create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _on_sqlite_connect)
        event.listen(engine, "begin", _on_sqlite_begin)
    return engine


class Database:
    """The process's handle on the database: an engine plus the migration entry point."""

    def __init__(self, url: str) -> None:
        self._engine = create_db_engine(url)

    @classmethod
    def from_settings(cls, settings: GatewaySettings | None = None) -> Database:
        """The database the deployment is configured for (SQLite file when unset)."""
        return cls((settings or get_settings()).resolved_database_url())

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``; some statements (upserts) depend on it."""
        return self._engine.dialect.name

    @property
    def display_url(self) -> str:
        """The URL with any password masked, safe for logs and CLI output."""
        return self._engine.url.render_as_string(hide_password=True)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection inside one write transaction, committed on success, rolled back on error.

        On SQLite the write lock is taken at ``BEGIN`` (``IMMEDIATE``): in WAL mode
        a transaction that reads first and writes later cannot upgrade once another
        connection has committed (SQLITE_BUSY_SNAPSHOT fails at once, busy_timeout
        does not apply), which turned every read-check-insert into a random 500
        under concurrent writers. Reads that need no lock use ``connect``.
        """
        with self._engine.connect() as conn:
            if self.dialect == "sqlite":
                conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reads; each statement's transaction ends when it is closed."""
        with self._engine.connect() as conn:
            yield conn

    def migrate(self) -> list[int]:
        """Bring the schema up to date; returns the versions applied by this call."""
        applied = run_migrations(self._engine)
        if applied:
            logger.info("migrated %s: applied %s", self.display_url, applied)
        return applied

    def dispose(self) -> None:
        """Close pooled connections (tests drop their database afterwards)."""
        self._engine.dispose()
