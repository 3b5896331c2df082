"""The migration runner on SQLite and PostgreSQL: idempotent, concurrent, atomic."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.storage import schema
from serve_app.storage.db import Database
from serve_app.storage.migrations import MIGRATIONS, Migration, run_migrations

LATEST = [m.version for m in MIGRATIONS]


def recorded_versions(db: Database) -> list[int]:
    with db.connect() as conn:
        rows = conn.execute(sa.select(schema.schema_migrations.c.version)).scalars()
        return sorted(rows)


def test_first_migrate_applies_everything_and_second_nothing(database_url: str) -> None:
    db = Database(database_url)
    try:
        assert db.migrate() == LATEST
        assert db.migrate() == []
        assert recorded_versions(db) == LATEST
        tables = set(sa.inspect(db.engine).get_table_names())
        assert {"orgs", "users", "memberships", "api_keys", "schema_migrations"} <= tables
    finally:
        db.dispose()


def test_concurrent_migrations_apply_each_version_once(database_url: str) -> None:
    databases = [Database(database_url) for _ in range(3)]
    barrier = threading.Barrier(len(databases))
    results: list[list[int]] = []
    failures: list[BaseException] = []

    def start(db: Database) -> None:
        try:
            barrier.wait()
            results.append(db.migrate())
        except BaseException as exc:  # re-raised below via the assertion
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(db,)) for db in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert failures == []
        assert sorted(v for applied in results for v in applied) == LATEST
        assert recorded_versions(databases[0]) == LATEST
    finally:
        for db in databases:
            db.dispose()


def test_migrated_database_matches_schema_module(db: Database) -> None:
    inspector = sa.inspect(db.engine)
    for table in schema.metadata.sorted_tables:
        reflected = {c["name"]: c for c in inspector.get_columns(table.name)}
        assert set(reflected) == set(table.columns.keys()), table.name
        for column in table.columns:
            assert reflected[column.name]["nullable"] == column.nullable, (table, column)
    indexes = {i["name"]: i for i in inspector.get_indexes("api_keys")}
    assert indexes["ix_api_keys_key_hash"]["unique"]


def _create_notes(conn: Connection) -> None:
    conn.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY)")


def test_appended_migration_runs_once(db: Database) -> None:
    history = (*MIGRATIONS, Migration(LATEST[-1] + 1, "notes", _create_notes))
    assert run_migrations(db.engine, history) == [LATEST[-1] + 1]
    assert run_migrations(db.engine, history) == []
    assert sa.inspect(db.engine).has_table("notes")


def test_failing_migration_leaves_nothing_behind(database_url: str) -> None:
    def broken(conn: Connection) -> None:
        _create_notes(conn)
        raise RuntimeError("boom")

    db = Database(database_url)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            run_migrations(db.engine, (*MIGRATIONS, Migration(LATEST[-1] + 1, "bad", broken)))
        inspector = sa.inspect(db.engine)
        assert not inspector.has_table("notes")
        assert not inspector.has_table("orgs")  # the whole run rolled back
        assert db.migrate() == LATEST
    finally:
        db.dispose()


@pytest.mark.parametrize("versions", [(2, 1), (1, 1), (0,)])
def test_history_must_be_unique_and_ascending(db: Database, versions: tuple[int, ...]) -> None:
    history = [Migration(v, f"m{v}", _create_notes) for v in versions]
    with pytest.raises(ValueError, match="ascending"):
        run_migrations(db.engine, history)
