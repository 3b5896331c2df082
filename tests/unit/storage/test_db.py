"""Database: engine settings that callers rely on."""

from __future__ import annotations

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
