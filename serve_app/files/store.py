"""The ``files`` table: a file's row, owned by an organization.

The bytes are in the object store under the row's ``object_key``; the row is
written after the bytes, so a listed file always has content, and removed before
them, so a deleted file is never listed while its bytes go.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.storage.db import Database
from serve_app.storage.pages import keyset_page
from serve_app.storage.schema import files

c = files.c


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def object_key(file_id: str) -> str:
    """Where a file's bytes live in the object store."""
    return f"files/{file_id}"


@dataclass(frozen=True)
class FileRecord:
    """A row of ``files``."""

    id: str
    org_id: str
    user_id: str
    purpose: str
    filename: str
    bytes: int
    object_key: str
    created_at: datetime

    def to_row(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _COLUMNS}

    @classmethod
    def from_row(cls, row: Any) -> FileRecord:
        return cls(**{name: row[name] for name in _COLUMNS})


_COLUMNS = tuple(col.name for col in files.columns)


class FileStore:
    """Reads and writes of ``files``; every read is scoped to one organization."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def insert(self, record: FileRecord) -> None:
        with self._db.begin() as conn:
            conn.execute(sa.insert(files).values(**record.to_row()))

    def insert_in(self, conn: Connection, record: FileRecord) -> None:
        """Insert unless a row with its id exists (a finalization run again)."""
        exists = conn.execute(sa.select(c.id).where(c.id == record.id)).first()
        if exists is None:
            conn.execute(sa.insert(files).values(**record.to_row()))

    def get(self, file_id: str, org_id: str) -> FileRecord | None:
        query = sa.select(files).where(c.id == file_id, c.org_id == org_id)
        with self._db.connect() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else FileRecord.from_row(row)

    def page(
        self, org_id: str, *, limit: int, after: str | None, purpose: str | None, newest_first: bool
    ) -> tuple[list[FileRecord], bool]:
        """Up to ``limit`` files after the file ``after`` (its position in the order);
        the bool says whether more follow."""
        filters = [] if purpose is None else [c.purpose == purpose]
        with self._db.connect() as conn:
            rows, more = keyset_page(
                conn,
                files,
                [c.org_id == org_id],
                limit=limit,
                after=after,
                newest_first=newest_first,
                filters=filters,
            )
        return [FileRecord.from_row(r) for r in rows], more

    def delete(self, file_id: str, org_id: str) -> FileRecord | None:
        """Remove the org's file row; returns it (None when there was none)."""
        with self._db.begin() as conn:
            row = (
                conn.execute(sa.select(files).where(c.id == file_id, c.org_id == org_id))
                .mappings()
                .first()
            )
            if row is None:
                return None
            conn.execute(sa.delete(files).where(c.id == file_id))
        return FileRecord.from_row(row)
