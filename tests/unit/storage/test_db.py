"""Database: engine settings that callers rely on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from serve_app.settings import GatewaySettings
from serve_app.storage.db import SQLITE_BUSY_TIMEOUT_MS, Database
from serve_app.storage.schema import api_keys, utcnow


def test_default_settings_use_a_sqlite_file_in_the_state_dir(tmp_path: Path) -> None:
    db = Database.from_settings(GatewaySettings(state_dir=tmp_path / "state"))
    try:
        assert db.dialect == "sqlite"
        db.migrate()
        assert (tmp_path / "state" / "gateway.db").is_file()
    finally:
        db.dispose()


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with db.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == SQLITE_BUSY_TIMEOUT_MS
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        db.dispose()


def test_foreign_keys_are_enforced(db: Database) -> None:
    row = {
        "id": "key_orphan",
        "key_hash": "0" * 64,
        "display_prefix": "abcdefgh",
        "user_id": "user_missing",
        "org_id": "org_missing",
        "scopes": "inference",
        "created_at": utcnow(),
    }
    with pytest.raises(sa.exc.IntegrityError), db.begin() as conn:
        conn.execute(sa.insert(api_keys).values(**row))


def test_failed_transaction_is_rolled_back(db: Database) -> None:
    with pytest.raises(RuntimeError), db.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO orgs (id, name, created_at) VALUES ('o1', 'acme', CURRENT_TIMESTAMP)"
        )
        raise RuntimeError("abort")
    with db.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM orgs").scalar() == 0


def test_display_url_hides_the_password() -> None:
    db = Database("postgresql+psycopg://gateway:s3cret@db.internal:5432/gateway")
    assert "s3cret" not in db.display_url
    assert "db.internal" in db.display_url
    db.dispose()


def test_sqlite_write_transactions_that_read_first_survive_a_concurrent_writer(
    tmp_path: Path,
) -> None:
    """A read-then-write transaction must not fail when another writer commits in between.

    In WAL mode a DEFERRED transaction that read a snapshot cannot upgrade to a
    writer once someone else committed (SQLITE_BUSY_SNAPSHOT, no busy wait), so
    ``Database.begin`` takes the write lock up front and the other writer waits.
    """
    url = f"sqlite:///{tmp_path / 'x.db'}"
    first, second = Database(url), Database(url)
    first.migrate()
    insert = "INSERT INTO orgs (id, name, created_at) VALUES (?, ?, CURRENT_TIMESTAMP)"
    errors: list[BaseException] = []

    def other_writer() -> None:
        try:
            with second.begin() as conn:
                conn.exec_driver_sql(insert, ("o2", "other"))
        except BaseException as err:  # reported by the assertion below
            errors.append(err)

    try:
        with first.begin() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM orgs").scalar() == 0
            writer = threading.Thread(target=other_writer)
            writer.start()
            writer.join(timeout=0.5)  # blocked behind our write lock, or already committed
            conn.exec_driver_sql(insert, ("o1", "mine"))
        writer.join(timeout=20)
        assert not errors
        with first.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM orgs").scalar() == 2
    finally:
        first.dispose()
        second.dispose()
